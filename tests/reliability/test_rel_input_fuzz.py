"""Hypothesis against every parser of outside input: manager.toml, agent.toml, the config
store settings, mock-accelerator.toml, ``-r`` values, ``ResourceSlot.from_user_input``,
and the agent's restart recovery reading ``resource.txt`` files.

The contract everywhere: a value or the module's own error type naming what is wrong,
never another exception; recovery never crashes and never loses a kernel.
Short run: 150 examples each; ``ACCELSHARE_RELIABILITY_FULL=1``: 3000.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner, Result

from accelshare.accel.errors import PluginConfigError
from accelshare.accel.mock.config import parse_mock_config
from accelshare.agent.recovery import discover_kernels, sort_kernels
from accelshare.agent.runtime.base import KernelInfo, KernelState
from accelshare.agent.state_files import AGENT_DIR, load_pending_events, read_device_history
from accelshare.api.schemas.sessions import CreateSessionBody
from accelshare.client.cli import app as cli_app
from accelshare.client.cli.args import ArgumentError, parse_resources
from accelshare.client.config import ClientConfigError, load_client_config
from accelshare.common import CommonValueError, ResourceSlot, SlotTypes
from accelshare.common.text_input import find_control, reserved_env_reason
from accelshare.config.agent_file import AgentConfigError, parse_agent_config
from accelshare.config.errors import ConfigFileError
from accelshare.config.settings import load_config_store_settings
from accelshare.manager.config import ManagerConfigError, load_manager_config
from accelshare.protocol import KernelEvent

from .conftest import scaled

T = TypeVar("T")
E = TypeVar("E", bound=Exception)
EXAMPLES = scaled(150, 3000)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TYPES: Mapping[str, SlotTypes | str] = {
    "cpu": SlotTypes.COUNT,
    "mem": SlotTypes.BYTES,
    "cuda.shares": SlotTypes.COUNT,
    "cuda.device": SlotTypes.COUNT,
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["1", "0.5", "1g", "inf", "Infinity", "NaN", "-1", "1e999", "127.0.0.1:1"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def attempt(error: type[E], call: Callable[[], T]) -> T | E:
    """``call()``, or the ``error`` it raised (any other exception propagates)."""
    try:
        return call()
    except error as e:
        return e


def tables(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped like a config file: known sections with known and odd keys."""
    section = st.dictionaries(st.sampled_from(keys) | st.text(max_size=10), values, max_size=6)
    return st.dictionaries(
        st.sampled_from(
            [
                "manager",
                "db",
                "api",
                "bootstrap",
                "agent",
                "etcd",
                "config-store",
                "container",
                "resource",
            ]
        ),
        section | values,
        max_size=4,
    )


def to_toml(data: Mapping[str, Any]) -> str | None:
    """A TOML document for ``data`` when it can be written as one (else None)."""

    def scalar(v: Any) -> str | None:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v) if abs(v) < 2**63 else None
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else None
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a TOML basic string
        if isinstance(v, list):
            items = [scalar(x) for x in v]
            return None if None in items else "[" + ", ".join(str(i) for i in items) + "]"
        return None

    lines: list[str] = []
    for name, body in data.items():
        if not isinstance(body, dict):
            return None
        lines.append(f"[{json.dumps(name)}]")
        for key, value in body.items():
            rendered = scalar(value)
            if rendered is None:
                continue
            lines.append(f"{json.dumps(key)} = {rendered}")
    return "\n".join(lines) + "\n"


MANAGER_KEYS = [
    "data-dir",
    "service-addr",
    "cluster-secret",
    "schedule-interval",
    "url",
    "pool-size",
    "busy-timeout",
    "max-clock-skew",
    "agent-timeout",
    "email",
]


@FUZZ
@given(st.one_of(st.text(max_size=200), tables(MANAGER_KEYS).map(to_toml)))
def test_manager_toml_never_crashes(
    tmp_path_factory: pytest.TempPathFactory, text: str | None
) -> None:
    if text is None:
        return
    path = tmp_path_factory.mktemp("m") / "manager.toml"
    path.write_text(text, encoding="utf-8")
    result = attempt(ManagerConfigError, lambda: load_manager_config(path))
    if isinstance(result, ManagerConfigError):
        assert str(path) in str(result)


@FUZZ
@given(
    st.one_of(
        st.text(max_size=200),
        tables(
            ["addr", "endpoints", "path", "namespace", "backend", "user", "password", "data-dir"]
        ).map(to_toml),
    )
)
def test_config_store_settings_never_crash(
    tmp_path_factory: pytest.TempPathFactory, text: str | None
) -> None:
    if text is None:
        return
    path = tmp_path_factory.mktemp("s") / "manager.toml"
    path.write_text(text, encoding="utf-8")
    result = attempt(ConfigFileError, lambda: load_config_store_settings(path, env={}))
    if isinstance(result, ConfigFileError):
        assert str(path) in str(result)


AGENT_KEYS = [
    "id",
    "rpc-listen-addr",
    "scaling-group",
    "runtime",
    "scratch-root",
    "scratch-size",
    "reserved-cpu",
    "reserved-mem",
    "allow-plugins",
    "addr",
]


@FUZZ
@given(tables(AGENT_KEYS))
def test_agent_toml_never_crashes(data: dict[str, Any]) -> None:
    result = attempt(AgentConfigError, lambda: parse_agent_config(data, source="fuzz.toml"))
    if isinstance(result, AgentConfigError):
        assert "fuzz.toml" in str(result)


MOCK_KEYS = [
    "slot_name",
    "device_plugin_name",
    "formats",
    "devices",
    "mother_uuid",
    "model_name",
    "memory_size",
    "processing_units",
    "numa_node",
    "is_mig_device",
]


@FUZZ
@given(st.dictionaries(st.sampled_from(MOCK_KEYS) | st.text(max_size=8), values, max_size=6))
def test_mock_accelerator_config_never_crashes(data: dict[str, Any]) -> None:
    result = attempt(PluginConfigError, lambda: parse_mock_config(data, source="fuzz-mock.toml"))
    if isinstance(result, PluginConfigError):
        assert "fuzz-mock.toml" in str(result)


@FUZZ
@given(
    st.lists(
        st.text(max_size=24)
        | st.builds("{}={}".format, st.text(max_size=10), st.text(max_size=10)),
        max_size=6,
    )
)
def test_resource_option_never_crashes(raw: list[str]) -> None:
    parsed = attempt(ArgumentError, lambda: parse_resources(raw))
    if isinstance(parsed, ArgumentError):
        assert str(parsed).startswith("-r")
        return
    assert all(isinstance(v, str) and v for v in parsed.values())


@FUZZ
@given(
    st.dictionaries(st.sampled_from(list(TYPES)) | st.text(max_size=12), values, max_size=5),
    st.booleans(),
)
def test_from_user_input_never_crashes(data: dict[str, Any], known: bool) -> None:
    try:
        slots = ResourceSlot.from_user_input(data, TYPES if known else None)
    except CommonValueError:
        return
    for amount in slots.values():
        assert amount.is_finite() or amount.is_infinite()
        assert not amount.is_nan()
        assert amount >= 0


env_names = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "BACKENDAI_MOCK_CUDA_DEVICES"]
    ),
    st.from_regex(
        r"(CUDA_MPS_|BACKENDAI_|ACCELSHARE_|BACKENDAI_SERVICE_PORT_)?[A-Z_]{0,6}", fullmatch=True
    ),
)


@FUZZ
@given(
    environ=st.dictionaries(env_names, st.text(max_size=20), max_size=4),
    command=st.none() | st.text(max_size=40),
    name=st.none() | st.text(max_size=12),
)
def test_session_body_text_rules_hold_for_any_input(
    environ: dict[str, str], command: str | None, name: str | None
) -> None:
    """Any environ, startup command and name: a body that keeps to the input rules, or a
    ``ValidationError`` -- never another exception, never a control character or one of
    the agent's variables let through."""
    payload: dict[str, Any] = {"image": "x", "config": {"environ": environ}}
    if command is not None:
        payload["startupCommand"] = command
    if name is not None:
        payload["name"] = name
    try:
        body = CreateSessionBody.model_validate(payload)
    except ValidationError:
        return
    for key, value in body.config.environ.items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)
        assert reserved_env_reason(key) is None
        assert find_control(value, multiline=True) is None
    if body.startup_command is not None:
        assert find_control(body.startup_command, multiline=True) is None
    if body.name is not None:
        assert find_control(body.name) is None


resource_lines = st.one_of(
    st.text(max_size=60),
    st.builds(
        "{}={}".format,
        st.sampled_from(
            [
                "CPU_SHARES",
                "MEM_SHARES",
                "CUDA.SHARES_SHARES",
                "CID",
                "SLOTS",
                "MOUNTS",
                "SCRATCH_SIZE",
                "UNIFIED_DEVICES",
            ]
        ),
        st.text(max_size=40),
    ),
)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["running", "exited", "orphan"]),
            st.one_of(st.lists(resource_lines, max_size=6).map("\n".join), st.just(None)),
        ),
        max_size=8,
    )
)
def test_recovery_sorts_every_kernel_exactly_once(kernels: list[tuple[str, str | None]]) -> None:
    infos: list[KernelInfo] = []
    texts: dict[str, str | OSError] = {}
    for i, (kind, text) in enumerate(kernels):
        kid = f"k{i:03d}"
        infos.append(
            KernelInfo(
                kid,
                "process",
                KernelState.EXITED if kind == "exited" else KernelState.RUNNING,
                cid=str(1000 + i),
                scratch_dir=None if kind == "orphan" else Path("/scratch") / kid,
            )
        )
        if text is not None:
            texts[kid] = text
    report = sort_kernels(infos, texts, TYPES)
    ids = [k.kernel_id for k in report.live]
    ids += [k.kernel_id for k in report.exited]
    ids += [k.info.kernel_id for k in report.unrecoverable]
    assert sorted(ids) == sorted(i.kernel_id for i in infos)  # none lost, none doubled


class _ScannedRuntime:
    """Just enough of a runtime for :func:`discover_kernels`."""

    def __init__(self, infos: list[KernelInfo]) -> None:
        self.infos = infos

    async def scan_kernels(self) -> list[KernelInfo]:
        return self.infos


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"\xff\xfe\x00garbage\x80\x81", id="not-utf8"),
        pytest.param(b"CUDA.SHARES_SHARES=g0:0.5\n\xc3(\n", id="one-bad-byte"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00" * 4096, id="nul-bytes"),
    ],
)
async def test_recovery_survives_a_garbled_resource_txt(tmp_path: Path, content: bytes) -> None:
    """Regression: a resource.txt that is not UTF-8 made discovery (and so the agent's
    start) raise UnicodeDecodeError; now that kernel is kept as unrecoverable."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for scratch in (good, bad):
        (scratch / "config").mkdir(parents=True)
    (good / "config" / "resource.txt").write_text("CUDA.SHARES_SHARES=g0:0.5\nCID=1\n")
    (bad / "config" / "resource.txt").write_bytes(content)
    runtime = _ScannedRuntime(
        [
            KernelInfo("good", "process", KernelState.RUNNING, cid="1", scratch_dir=good),
            KernelInfo("bad", "process", KernelState.RUNNING, cid="2", scratch_dir=bad),
        ]
    )
    report = await discover_kernels(runtime, TYPES)  # type: ignore[arg-type]
    assert [k.kernel_id for k in report.live if k.kernel_id == "good"] == ["good"]
    ids = [k.kernel_id for k in report.live] + [u.info.kernel_id for u in report.unrecoverable]
    assert sorted(ids) == ["bad", "good"]


def test_toml_helper_writes_what_tomllib_reads() -> None:
    text = to_toml({"manager": {"a": 1, "b": 'x"y', "c": [1, 2]}})
    assert text is not None
    assert tomllib.loads(text) == {"manager": {"a": 1, "b": 'x"y', "c": [1, 2]}}


@pytest.mark.parametrize(
    ("slot", "value"),
    [("cpu", 1e308), ("cuda.shares", "9" * 40), ("mem", 1e300), ("mem", 10**30), ("cpu", "1e21")],
)
def test_absurd_amounts_are_refused_by_name(slot: str, value: object) -> None:
    """Regression: beyond the decimal context's 28 digits ``quantize`` raised
    InvalidOperation (a 500 through the API) instead of a SlotValueError."""
    with pytest.raises(CommonValueError, match="an amount below 10\\^21") as caught:
        ResourceSlot.from_user_input({slot: value}, TYPES)
    assert caught.value.field == slot
    assert ResourceSlot.from_user_input({"cpu": "1e20"}, TYPES)["cpu"] == Decimal("1e20")


# -- the agent's own state files (events.json, devices.json) --------------------------------

_GOOD_EVENT = {
    "event_id": "e-1",
    "kernel_id": "k-1",
    "session_id": "s-1",
    "event": "exited",
    "exit_code": 0,
    "reason": "",
    "at": "2026-11-25T00:00:00+00:00",
}
_GOOD_EVENTS = json.dumps({"events": [_GOOD_EVENT, {**_GOOD_EVENT, "event_id": "e-2"}]}).encode()
_GOOD_DEVICES = json.dumps({"slots": {"cpu": {"0": "1", "1": "1"}, "mem": {"0": "1024"}}}).encode()
state_files = st.one_of(
    st.binary(max_size=300),
    values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"events": values}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"slots": values}).map(lambda v: json.dumps(v).encode()),
    # a file cut short (a crash in the middle of a write the atomic rename did not cover)
    st.builds(
        lambda doc, cut: doc[:cut],
        st.sampled_from([_GOOD_EVENTS, _GOOD_DEVICES]),
        st.integers(0, len(_GOOD_EVENTS)),
    ),
)


@FUZZ
@given(content=state_files)
def test_agent_state_files_never_crash(
    tmp_path_factory: pytest.TempPathFactory, content: bytes
) -> None:
    """Garbage, wrong shapes or truncation in ``events.json`` / ``devices.json`` never
    stop the agent's start: whatever is readable is used, the rest dropped with a
    warning (``events.json`` with ``"events": 5`` raised TypeError before)."""
    root = tmp_path_factory.mktemp("scratch")
    (root / AGENT_DIR).mkdir()
    (root / AGENT_DIR / "events.json").write_bytes(content)
    (root / AGENT_DIR / "devices.json").write_bytes(content)
    events = load_pending_events(root)
    assert all(isinstance(event, KernelEvent) for event in events)
    assert not (root / AGENT_DIR / "events.json").exists()  # read once, never again
    history = read_device_history(root)
    for per_device in history.values():
        assert all(isinstance(amount, Decimal) for amount in per_device.values())


def test_agent_state_files_are_read_when_whole(tmp_path: Path) -> None:
    """The positive side of the fuzz above: intact files give back what they hold."""
    (tmp_path / AGENT_DIR).mkdir()
    (tmp_path / AGENT_DIR / "events.json").write_bytes(_GOOD_EVENTS)
    (tmp_path / AGENT_DIR / "devices.json").write_bytes(_GOOD_DEVICES)
    assert [e.event_id for e in load_pending_events(tmp_path)] == ["e-1", "e-2"]
    assert read_device_history(tmp_path) == {
        "cpu": {"0": Decimal(1), "1": Decimal(1)},
        "mem": {"0": Decimal(1024)},
    }


# -- accelshare mgr etcd put-json ------------------------------------------------------------

_TREE_KEYS = st.one_of(
    st.sampled_from(["config", "a", "", "a/b", "..", "x y", "\x00", "k" * 300, "-", "_"]),
    st.text(max_size=10),
)
trees = st.recursive(
    scalars,
    lambda inner: st.dictionaries(_TREE_KEYS, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=10,
)
put_json_files = st.one_of(
    trees.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(_TREE_KEYS, trees, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=100),
)


@settings(
    max_examples=scaled(15, 400),  # each example runs the CLI three times (~0.3 s)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(content=put_json_files, key=st.sampled_from(["", "config", "config/x", "a//b", "/"]))
def test_put_json_never_crashes_and_refuses_whole(
    tmp_path_factory: pytest.TempPathFactory, content: bytes, key: str
) -> None:
    """``accelshare mgr etcd put-json KEY FILE`` on the embedded store with any file:
    exit 0, or exit 1 with one ``error: ...`` line and the tree exactly as before
    (validated completely before anything is written); never a traceback."""
    tmp = tmp_path_factory.mktemp("put-json")
    config = tmp / "agent.toml"
    config.write_text(f'[config-store]\npath = "{tmp / "store.db"}"\n')
    upload = tmp / "tree.json"
    upload.write_bytes(content)
    runner = CliRunner()

    def cli(*args: str) -> Result:
        return runner.invoke(cli_app, ["mgr", "etcd", *args, "--config", str(config)])

    seed = tmp / "seed.json"
    seed.write_text('{"config": {"keep": "me"}}')
    assert cli("put-json", "", str(seed), "--create").exit_code == 0
    before = cli("get", "--prefix", "", "--json").stdout
    result = cli("put-json", key, str(upload))
    assert result.exit_code in (0, 1), (result.exit_code, result.output, result.exception)
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: "), result.stderr
        assert cli("get", "--prefix", "", "--json").stdout == before


def test_put_json_refusal_and_success_are_both_seen(tmp_path: Path) -> None:
    """The two outcomes the fuzz above allows, each shown once on purpose."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[config-store]\npath = "{tmp_path / "store.db"}"\n')
    runner = CliRunner()

    def cli(*args: str) -> Result:
        return runner.invoke(cli_app, ["mgr", "etcd", *args, "--config", str(config)])

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"config": {"a": "1"}}')
    bad.write_text('{"config": {"b": "2", "": {"\\u0000": [1, {"c": null}]}}}')
    assert cli("put-json", "", str(good), "--create").exit_code == 0
    before = cli("get", "--prefix", "", "--json").stdout
    refused = cli("put-json", "", str(bad))
    assert refused.exit_code == 1, refused.output
    assert refused.stderr.startswith(f"error: {bad}: "), refused.stderr
    assert cli("get", "--prefix", "", "--json").stdout == before
    assert json.loads(before) == {"config": {"a": "1"}}


# -- the client's config file (client.toml / client.env) ------------------------------------

client_files = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.dictionaries(
        st.sampled_from(["endpoint", "access_key", "secret_key", "secret-key", "x"]), values
    ).map(lambda d: "\n".join(f"{k} = {json.dumps(v)}" for k, v in d.items()).encode()),
    st.lists(
        st.sampled_from(
            [
                "ACCELSHARE_ACCESS_KEY=AK",
                "export ACCELSHARE_SECRET_KEY='S'",
                "#",
                "BROKEN",
                "=",
                "ACCELSHARE_ENDPOINT=http://x",
                "",
            ]
        )
    ).map(lambda lines: "\n".join(lines).encode()),
)


@FUZZ
@given(content=client_files, suffix=st.sampled_from([".toml", ".env"]))
def test_client_config_never_crashes(
    tmp_path_factory: pytest.TempPathFactory, content: bytes, suffix: str
) -> None:
    """Any client.toml / client.env: a ClientConfig or a ClientConfigError naming the
    file or the missing keypair, never another exception (bytes that are not UTF-8
    raised UnicodeDecodeError before), and never the secret key in the message."""
    path = tmp_path_factory.mktemp("client") / f"client{suffix}"
    path.write_bytes(content)
    outcome = attempt(ClientConfigError, lambda: load_client_config(env={}, config_file=path))
    if isinstance(outcome, ClientConfigError):
        assert str(path) in str(outcome) or "no API keypair" in str(outcome), outcome
    else:
        assert outcome.access_key
        assert outcome.secret_key
    folder = attempt(ClientConfigError, lambda: load_client_config(env={}, config_file=path.parent))
    assert isinstance(folder, ClientConfigError)
