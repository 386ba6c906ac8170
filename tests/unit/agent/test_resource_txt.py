"""resource.txt writer and reader: the spec's examples, round trips, and garbage."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.agent.resource_txt import (
    MountEntry,
    ResourceTxt,
    ResourceTxtError,
    parse_resource_txt,
    render_resource_txt,
    with_container_id,
)
from accelshare.common import ResourceSlot, SlotTypes

GPU1 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d01"
GPU2 = "c59395cd-ac91-4cd3-a1b0-3d2568aa2d02"
SLOT_TYPES: dict[str, SlotTypes] = {
    "cpu": SlotTypes.COUNT,
    "mem": SlotTypes.BYTES,
    "cuda.shares": SlotTypes.COUNT,
    "cuda.device": SlotTypes.COUNT,
    "cuda.device:10g-mig": SlotTypes.UNIQUE,
}


def spec_example() -> ResourceTxt:
    return ResourceTxt(
        slots=ResourceSlot(
            {"cpu": Decimal(2), "mem": Decimal(2 * 1024**3), "cuda.shares": Decimal("1.2")}
        ),
        allocations={
            "cpu": {"0": Decimal(1), "1": Decimal(1)},
            "mem": {"root": Decimal(2 * 1024**3)},
            "cuda.shares": {GPU1: Decimal("0.6"), GPU2: Decimal("0.6")},
        },
        extra_lines=(
            ("CUDA_GLOBAL_DEVICE_IDS", f"0:{GPU1},1:{GPU2}"),
            ("CUDA_RESOURCE_VIRTUALIZED", "1"),
        ),
    )


EXPECTED_TEXT = f"""\
SCRATCH_SIZE=0m
MOUNTS=
SLOTS={{"cpu":"2","mem":"2147483648","cuda.shares":"1.2"}}
UNIFIED_DEVICES=[]
CPU_SHARES=0:1,1:1
MEM_SHARES=root:2g
CUDA.SHARES_SHARES={GPU1}:0.6,{GPU2}:0.6
CUDA_GLOBAL_DEVICE_IDS=0:{GPU1},1:{GPU2}
CUDA_RESOURCE_VIRTUALIZED=1
"""


def test_render_matches_the_spec_example_line_for_line() -> None:
    assert render_resource_txt(spec_example(), SLOT_TYPES) == EXPECTED_TEXT


def test_parse_reads_the_spec_example_back() -> None:
    parsed = parse_resource_txt(EXPECTED_TEXT, SLOT_TYPES)
    assert parsed == spec_example()
    assert parsed.allocations["mem"] == {"root": Decimal(2147483648)}
    assert parsed.allocations["cuda.shares"] == {GPU1: Decimal("0.6"), GPU2: Decimal("0.6")}
    assert parsed.allocations_by_plugin() == {
        "cpu": {"cpu": {"0": Decimal(1), "1": Decimal(1)}},
        "mem": {"mem": {"root": Decimal(2147483648)}},
        "cuda": {"cuda.shares": {GPU1: Decimal("0.6"), GPU2: Decimal("0.6")}},
    }
    assert parsed.extra("CUDA_RESOURCE_VIRTUALIZED") == "1"
    assert parsed.extra("NOPE") is None


def test_cid_is_appended_once_and_never_duplicated() -> None:
    text = with_container_id(EXPECTED_TEXT, "4242")
    assert text == EXPECTED_TEXT + "CID=4242\n"
    assert with_container_id(text, "4242") == text  # a restarted agent writes it again
    replaced = with_container_id(text, "abc")
    assert replaced.count("CID=") == 1
    assert replaced.endswith("CID=abc\n")
    assert parse_resource_txt(replaced, SLOT_TYPES).container_id == "abc"


def test_cid_duplicates_from_older_files_collapse_to_one() -> None:
    text = EXPECTED_TEXT + "CID=1\nCID=2\n"
    assert parse_resource_txt(text, SLOT_TYPES).container_id == "2"  # last one wins
    fixed = with_container_id(text, "3")
    assert fixed.count("CID=") == 1
    assert parse_resource_txt(fixed, SLOT_TYPES).container_id == "3"


def test_render_with_container_id_writes_it_last() -> None:
    content = ResourceTxt(allocations={"cpu": {"0": Decimal(1)}}, container_id="c0ffee")
    text = render_resource_txt(content, SLOT_TYPES)
    assert text.splitlines()[-1] == "CID=c0ffee"
    assert parse_resource_txt(text, SLOT_TYPES) == content


@pytest.mark.parametrize(
    ("line", "slot", "allocation"),
    [
        pytest.param("CPU_SHARES=0:1,1:1", "cpu", {"0": Decimal(1), "1": Decimal(1)}, id="cpu"),
        pytest.param("MEM_SHARES=root:2g", "mem", {"root": Decimal(2 << 30)}, id="mem-short"),
        pytest.param("MEM_SHARES=root:512m", "mem", {"root": Decimal(512 << 20)}, id="mem-512m"),
        pytest.param("MEM_SHARES=root:1073741824", "mem", {"root": Decimal(1 << 30)}, id="mem-int"),
        pytest.param(
            f"CUDA.SHARES_SHARES={GPU1}:0.6,{GPU2}:0.6",
            "cuda.shares",
            {GPU1: Decimal("0.6"), GPU2: Decimal("0.6")},
            id="fgpu",
        ),
        pytest.param(f"CUDA.DEVICE_SHARES={GPU1}:1", "cuda.device", {GPU1: Decimal(1)}, id="gpu"),
        pytest.param(
            f"CUDA.DEVICE:10G-MIG_SHARES=MIG-{GPU1}/1/0:1",
            "cuda.device:10g-mig",
            {f"MIG-{GPU1}/1/0": Decimal(1)},
            id="mig-device-id-with-slashes",
        ),
        pytest.param(
            "CPU_SHARES= 0 : 1 ", "cpu", {"0": Decimal(1)}, id="spaces-around-items-are-stripped"
        ),
        pytest.param(
            "ROCM.DEVICE_SHARES=0000:99:00.0:1",
            "rocm.device",
            {"0000:99:00.0": Decimal(1)},
            id="unknown-slot-device-id-with-colons",
        ),
        pytest.param(
            "TPU.MEM_SHARES=t0:1g", "tpu.mem", {"t0": Decimal(1 << 30)}, id="unknown-bytes-slot"
        ),
    ],
)
def test_shares_lines(line: str, slot: str, allocation: dict[str, Decimal]) -> None:
    assert parse_resource_txt(line + "\n", SLOT_TYPES).allocations == {slot: allocation}


def test_minor_slot_names_keep_their_case_when_known() -> None:
    types = {**SLOT_TYPES, "cuda.device:1G.5GB-mig": SlotTypes.UNIQUE}
    content = ResourceTxt(allocations={"cuda.device:1G.5GB-mig": {"m0": Decimal(1)}})
    text = render_resource_txt(content, types)
    assert "CUDA.DEVICE:1G.5GB-MIG_SHARES=m0:1" in text
    assert parse_resource_txt(text, types).allocations == content.allocations


def test_mounts_scratch_size_unified_devices_round_trip() -> None:
    content = ResourceTxt(
        scratch_size_bytes=64 * 1024 * 1024,
        mounts=(MountEntry("/data/a", "/home/work/a", "ro"), MountEntry("/x:y", "/b", "rw")),
        unified_devices=(("cuda", "cuda.device"),),
    )
    text = render_resource_txt(content, SLOT_TYPES)
    assert "SCRATCH_SIZE=64m\n" in text
    assert "MOUNTS=/data/a:/home/work/a:ro,/x:y:/b:rw\n" in text
    assert 'UNIFIED_DEVICES=[["cuda","cuda.device"]]\n' in text
    assert parse_resource_txt(text, SLOT_TYPES) == content


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("\n\n   \n", id="blank"),
        pytest.param("just words\n# CPU_SHARES=0:1\n", id="no-equals-and-comment"),
        pytest.param("CPU_SHARES=\n", id="empty-shares"),
    ],
)
def test_lines_that_are_skipped(text: str) -> None:
    assert parse_resource_txt(text, SLOT_TYPES) == ResourceTxt()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("CPU_SHARES=0:1,1\n", "is not '<device>:<amount>'", id="item-without-colon"),
        pytest.param("CPU_SHARES=0:x\n", "is not a decimal", id="bad-count"),
        pytest.param("CPU_SHARES=0:-1\n", "must be finite and >= 0", id="negative"),
        pytest.param("CPU_SHARES=0:NaN\n", "must be finite", id="nan"),
        pytest.param("CPU_SHARES=0:Infinity\n", "must be finite", id="infinite"),
        pytest.param("MEM_SHARES=root:1.5\n", "binary size", id="bytes-fraction"),
        pytest.param("CPU_SHARES=0:1,0:1\n", "appears twice", id="device-twice"),
        pytest.param("CPU_SHARES=0:1\nCPU_SHARES=1:1\n", "duplicate key", id="slot-twice"),
        pytest.param("CPU_SHARES=0:1\nCpu_SHARES=1:1\n", "two lines", id="slot-twice-case"),
        pytest.param("!!_SHARES=0:1\n", "does not name a slot", id="bad-slot"),
        pytest.param("SLOTS={bad json\n", "not valid JSON", id="slots-json"),
        pytest.param("SLOTS=[1]\n", "JSON object", id="slots-not-object"),
        pytest.param('SLOTS={"cpu":"x"}\n', "invalid amount", id="slots-amount"),
        pytest.param('SLOTS={"cpu":"-1"}\n', ">= 0", id="slots-negative"),
        pytest.param("SCRATCH_SIZE=lots\n", "SCRATCH_SIZE", id="scratch"),
        pytest.param("MOUNTS=/a:/b\n", "source:target:perm", id="mounts"),
        pytest.param("UNIFIED_DEVICES=[[1]]\n", "UNIFIED_DEVICES", id="unified"),
        pytest.param("SLOTS=" + "[" * 100_000 + "\n", "not valid JSON", id="json-depth-bomb"),
    ],
)
def test_garbage_in_known_keys_raises_a_clear_error(text: str, reason: str) -> None:
    with pytest.raises(ResourceTxtError) as info:
        parse_resource_txt(text, SLOT_TYPES, source="/scratch/k1/config/resource.txt")
    message = str(info.value)
    assert reason in message
    assert message.startswith("/scratch/k1/config/resource.txt, line ")
    assert info.value.line_no == text.count("\n")


def test_error_names_the_right_line() -> None:
    text = EXPECTED_TEXT + "GPU_STUFF=ok\nCUDA.DEVICE_SHARES=a:one\n"
    with pytest.raises(ResourceTxtError) as info:
        parse_resource_txt(text, SLOT_TYPES, source="rt.txt")
    assert info.value.line_no == 11
    assert info.value.line == "CUDA.DEVICE_SHARES=a:one"
    assert "rt.txt, line 11" in str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(ResourceTxt(allocations={"cpu": {"a,b": Decimal(1)}}), id="comma-in-device"),
        pytest.param(ResourceTxt(allocations={"cpu": {"": Decimal(1)}}), id="empty-device"),
        pytest.param(ResourceTxt(allocations={"cpu": {"0": Decimal(-1)}}), id="negative"),
        pytest.param(ResourceTxt(allocations={"mem": {"root": Decimal("1.5")}}), id="bytes-frac"),
        pytest.param(ResourceTxt(allocations={"Bad Slot": {"0": Decimal(1)}}), id="bad-slot"),
        pytest.param(ResourceTxt(extra_lines=(("CID", "x"),)), id="extra-cid"),
        pytest.param(ResourceTxt(extra_lines=(("X_SHARES", "x"),)), id="extra-shares"),
        pytest.param(ResourceTxt(extra_lines=(("A=B", "x"),)), id="extra-equals"),
        pytest.param(ResourceTxt(extra_lines=(("A", "x\ny"),)), id="extra-newline"),
        pytest.param(ResourceTxt(mounts=(MountEntry("/a", "/b:c", "ro"),)), id="mount-colon"),
        pytest.param(ResourceTxt(scratch_size_bytes=-1), id="negative-scratch"),
    ],
)
def test_writer_refuses_what_it_could_not_read_back(content: ResourceTxt) -> None:
    with pytest.raises(ValueError, match=r"resource\.txt|Invalid slot name"):
        render_resource_txt(content, SLOT_TYPES)


def test_slots_with_no_device_are_not_written() -> None:
    text = render_resource_txt(ResourceTxt(allocations={"cuda.shares": {}}), SLOT_TYPES)
    assert "_SHARES" not in text


# -- properties ---------------------------------------------------------------------------

device_ids = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters=",\n\r\x0b\x0c\x1c\x1d\x1e\x85"),
    min_size=1,
    max_size=12,
).filter(lambda s: s.strip() == s and s != "")
counts = st.decimals(min_value=0, max_value=10_000, places=3, allow_nan=False)
byte_sizes = st.integers(min_value=0, max_value=2**50).map(Decimal)
allocations = st.fixed_dictionaries(
    {},
    optional={
        "cpu": st.dictionaries(device_ids, counts, min_size=1, max_size=4),
        "mem": st.dictionaries(device_ids, byte_sizes, min_size=1, max_size=2),
        "cuda.shares": st.dictionaries(device_ids, counts, min_size=1, max_size=4),
        "cuda.device:10g-mig": st.dictionaries(
            device_ids, st.just(Decimal(1)), min_size=1, max_size=3
        ),
    },
)
extra_keys = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,15}\Z").filter(
    lambda k: (
        k not in {"SCRATCH_SIZE", "MOUNTS", "SLOTS", "UNIFIED_DEVICES", "CID"}
        and not k.endswith("_SHARES")
    )
)
extra_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=20
).map(str.strip)


@st.composite
def contents(draw: st.DrawFn) -> ResourceTxt:
    allocation = draw(allocations)
    slots = ResourceSlot({slot: sum(per.values(), Decimal(0)) for slot, per in allocation.items()})
    return ResourceTxt(
        slots=slots,
        allocations=allocation,
        scratch_size_bytes=draw(st.integers(min_value=0, max_value=2**40)),
        extra_lines=tuple(draw(st.lists(st.tuples(extra_keys, extra_values), max_size=4))),
        container_id=draw(st.none() | st.from_regex(r"\A[0-9a-f]{1,64}\Z")),
    )


@given(contents())
def test_round_trip_is_identity(content: ResourceTxt) -> None:
    text = render_resource_txt(content, SLOT_TYPES)
    assert parse_resource_txt(text, SLOT_TYPES) == content


@given(contents(), st.from_regex(r"\A[0-9a-f]{1,64}\Z"))
def test_cid_is_idempotent(content: ResourceTxt, cid: str) -> None:
    once = with_container_id(render_resource_txt(content, SLOT_TYPES), cid)
    assert with_container_id(once, cid) == once
    assert once.count("\nCID=") + once.startswith("CID=") == 1


garbage_lines = st.one_of(
    st.text(max_size=80),
    st.builds(
        "{}={}".format,
        st.sampled_from(
            [
                "SCRATCH_SIZE",
                "MOUNTS",
                "SLOTS",
                "UNIFIED_DEVICES",
                "CID",
                "CPU_SHARES",
                "MEM_SHARES",
                "CUDA.SHARES_SHARES",
                "X_SHARES",
                "_SHARES",
                "EXTRA",
            ]
        ),
        st.text(max_size=60)
        | st.from_regex(r"\A([a-z0-9.:-]{0,6}:[-0-9.eE+a-zA-Z]{0,8},?){0,3}\Z")
        | st.from_regex(r'\A[\[\]{}":,0-9a-z. -]{0,30}\Z'),
    ),
)


@settings(max_examples=200)
@given(st.lists(garbage_lines, max_size=12).map("\n".join))
def test_garbage_never_crashes_the_reader(text: str) -> None:
    try:
        parsed = parse_resource_txt(text, SLOT_TYPES, source="fuzz")
    except ResourceTxtError as e:
        error: ResourceTxtError | None = e
    else:
        error = None
    if error is not None:
        assert str(error).startswith("fuzz, line ")
        assert 1 <= error.line_no <= text.count("\n") + 1
        return
    for per_device in parsed.allocations.values():
        assert all(amount.is_finite() and amount >= 0 for amount in per_device.values())


def test_resource_txt_module_is_pure() -> None:
    code = (
        "import sys, accelshare.agent.resource_txt\n"
        "print(','.join(m for m in ('asyncio', 'subprocess', 'socket', 'aiodocker', 'psutil')"
        " if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
