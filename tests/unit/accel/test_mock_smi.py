"""The mock ``nvidia-smi``: what a session holding mock CUDA devices is shown.

The files come from the mock plugin itself (``kernel_resources``), are written into a
temporary config dir, and the tool runs over them with a session-like environment.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

import pytest

from accelshare.accel.mock import MockPlugin, load_mock_config, smi
from accelshare.accel.types import ConfigFile

from .builders import FRACTIONAL, GIB, SAMPLES, U, mock_plugin, options

D = Decimal
GPU1, GPU2, GPU3 = f"{U}1", f"{U}2", f"{U}3"
MIG_10G = f"MIG-{U}3/3/0"  # cuda-mock-mig.toml: the first MIG-10g slice (list index 3)


def session(
    tmp_path: Path, plugin: MockPlugin, allocation: Mapping[str, Mapping[str, Decimal]]
) -> dict[str, str]:
    """Write the kernel's config files as the agent would; return the session's env."""
    resources = plugin.kernel_resources(allocation)
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "resource.txt").write_text("")
    for file in resources.config_files:
        (config / file.path).parent.mkdir(parents=True, exist_ok=True)
        (config / file.path).write_text(file.text)
    return {**resources.env, smi.RESOURCE_TXT_ENV: str(config / "resource.txt")}


def query(env: Mapping[str, str], fields: str, fmt: str = "csv,noheader,nounits") -> list[str]:
    return smi.run([f"--query-gpu={fields}", f"--format={fmt}"], env).splitlines()


# -- memory: the session's share ---------------------------------------------------------------


def test_half_a_two_fgpu_device_shows_half_of_unit_mem(tmp_path: Path) -> None:
    # two-fgpu: 2 GiB GPUs, default unit_mem 2 GiB -> 1.0 share each; 0.5 -> 1 GiB.
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    env = session(tmp_path, plugin, {"cuda.shares": {GPU2: D("0.5")}})
    assert env["BACKENDAI_MOCK_CUDA_DEVICES"] == GPU2
    assert query(env, "index,uuid,memory.total") == [f"0, GPU-{GPU2}, 1024"]
    table = smi.run([], env)
    assert "/ 1024MiB |" in table
    assert "GPU 0: 0.50 of 1.00 shares = 1024MiB of 2048MiB" in table


def test_shares_follow_unit_mem_not_the_device_size(tmp_path: Path) -> None:
    # The "0.5 fGPU of an 8 GB card shows about 2 GB" holds when unit_mem is
    # 4 GiB; the spec's formula is unit_mem x shares, whatever the card's size.
    plugin = mock_plugin("mock-accelerator.toml", FRACTIONAL, unit_mem=4 * GIB)
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.5"), GPU3: D("2.5")}})
    assert query(env, "index,memory.total,memory.free") == ["0, 2048, 2048", "1, 10240, 10240"]


def test_decimal_shares_round_bytes_down_to_whole_mib(tmp_path: Path) -> None:
    # 2 GiB x 0.3 = 644245094.4 bytes -> 644245094 -> 614 MiB (614.4 rounded down).
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.3")}})
    doc = json.loads((tmp_path / "config" / smi.DEVICES_FILE).read_text())
    assert doc["devices"][0]["memory_bytes"] == 644245094
    assert doc["devices"][0]["shares"] == "0.3"
    assert query(env, "memory.total", "csv") == ["memory.total [MiB]", "614 MiB"]


def test_whole_devices_show_their_full_memory_and_list(tmp_path: Path) -> None:
    plugin = mock_plugin("mock-accelerator.toml")
    env = session(tmp_path, plugin, {"cuda.device": {GPU1: D(1), GPU3: D(1)}})
    assert query(env, "index,name,memory.total,pci.bus_id") == [
        "0, CUDA GPU, 40960, 00000000:99:00.0",
        "1, CUDA GPU, 40960, 00000000:99:02.0",
    ]
    assert smi.run(["-L"], env) == (
        f"GPU 0: CUDA GPU (UUID: GPU-{GPU1})\nGPU 1: CUDA GPU (UUID: GPU-{GPU3})\n"
    )
    assert "fractional" not in smi.run([], env)  # no share footer for whole devices


def test_a_mig_slice_is_shown_whole_with_its_mig_uuid(tmp_path: Path) -> None:
    plugin = mock_plugin("cuda-mock-mig.toml")
    env = session(tmp_path, plugin, {"cuda.device:10g-mig": {MIG_10G: D(1)}})
    assert query(env, "name,uuid,memory.total,mig.mode.current") == [
        f"MIG-10g, {MIG_10G}, 10240, Enabled"
    ]


def test_the_wrapper_runs_the_agents_interpreter_isolated() -> None:
    plugin = MockPlugin(
        load_mock_config(SAMPLES / "two-fgpu.toml"),
        options(FRACTIONAL),
        python="/opt/agent env/bin/python",
    )
    wrapper, script, devices = plugin.smi_files([], [])
    assert (wrapper.path, wrapper.executable) == ("bin/nvidia-smi", True)
    assert wrapper.text.splitlines()[2] == (
        "if [ -x '/opt/agent env/bin/python' ]; then "
        'exec \'/opt/agent env/bin/python\' -I "${0%/*}/mock_smi.py" "$@"; fi'
    )
    assert script.path == f"bin/{smi.SCRIPT_FILE}"
    assert json.loads(devices.text)["devices"] == []


BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")  # the host's, outside the venv


@pytest.mark.parametrize(
    "agent_python",
    [
        sys.executable,
        # An agent whose interpreter has no accelshare installed (it came through
        # PYTHONPATH, which -I ignores): seen on a GPU machine, 2026-11-28.
        BASE_PYTHON,
        "/nonexistent/agent/python",
    ],
)
def test_the_wrapper_works_with_or_without_the_agents_interpreter(
    tmp_path: Path, agent_python: str
) -> None:
    """The agent's interpreter runs the stand-alone copy (standard library only, so it
    needs no installed accelshare); without that interpreter (a docker container) the
    ``python3`` on PATH runs it; here the host's, with the agent's package hidden."""
    plugin = MockPlugin(
        load_mock_config(SAMPLES / "two-fgpu.toml"), options(FRACTIONAL), python=agent_python
    )
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.5")}})
    wrapper = tmp_path / "config" / "bin" / "nvidia-smi"
    wrapper.chmod(0o755)
    bin_dir = tmp_path / "container-bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")  # no venv
    result = subprocess.run(
        [str(wrapper), "--query-gpu=index,memory.total", "--format=csv,noheader"],
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "0, 1024 MiB\n", "")


def test_a_session_rewriting_its_environment_still_sees_only_its_devices(
    tmp_path: Path,
) -> None:
    """The devices come from the allocation the agent wrote, not from the variables."""
    plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.5")}})
    spoofed = {**env, "BACKENDAI_MOCK_CUDA_DEVICES": f"{GPU1},{GPU2}", "CUDA_VISIBLE_DEVICES": GPU2}
    assert query(spoofed, "uuid,memory.total") == [f"GPU-{GPU1}, 1024"]
    assert query({**env, "BACKENDAI_MOCK_CUDA_DEVICES": ""}, "uuid") == [f"GPU-{GPU1}"]

    # The tool the session runs finds its config dir from where it lies: pointing
    # $ACCELSHARE_RESOURCE_TXT at another session's files shows nothing of theirs.
    other = tmp_path / "other"
    other.mkdir()
    session(other, plugin, {"cuda.shares": {GPU2: D("1")}})
    wrapper = tmp_path / "config" / "bin" / "nvidia-smi"
    wrapper.chmod(0o755)
    result = subprocess.run(
        [str(wrapper), "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
        env={
            **spoofed,
            smi.RESOURCE_TXT_ENV: str(other / "config" / "resource.txt"),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert (result.returncode, result.stdout) == (0, f"GPU-{GPU1}, 1024\n"), result.stderr
    assert smi.own_config_dir(str(tmp_path / "config" / "bin" / smi.SCRIPT_FILE)) == (
        tmp_path / "config"
    )
    assert smi.own_config_dir(str(tmp_path / "elsewhere" / smi.SCRIPT_FILE)) is None


def test_only_cuda_mock_keys_get_the_tool(tmp_path: Path) -> None:
    rocm = mock_plugin("rocm-mock.toml")
    device = rocm.inventory.devices[0].device_id
    assert rocm.kernel_resources({"rocm.device": {device: D(1)}}).config_files == ()


# -- readings ------------------------------------------------------------------------------


def view(device: smi.SmiDevice, reading: smi.SmiReading | None = None) -> smi.SmiView:
    readings = {} if reading is None else {device.device_id: reading}
    return smi.SmiView("450.00.00", "11.0", (device,), readings)


HALF = smi.SmiDevice(
    device_id=GPU1,
    name="CUDA GPU",
    bus_id="00000000:99:00.0",
    memory_bytes=GIB,
    device_memory_bytes=2 * GIB,
    processors=4,
    shares=D("0.5"),
    device_shares=D("1.00"),
)


@pytest.mark.parametrize(
    ("device", "util", "mem_fraction", "expected_util", "expected_used_mib"),
    [
        pytest.param(HALF, "93.0", "0.25", 46, 256, id="half-share:util-x0.5"),
        pytest.param(
            smi.SmiDevice(GPU1, "CUDA GPU", "x", 5 * GIB, 40 * GIB, 21, D("2.7"), D("13.50")),
            "50.0",
            "0.5",
            10,  # 50 x 2.7 / 13.5
            2560,  # half of the 5 GiB the session holds
            id="2.7-of-13.5",
        ),
        pytest.param(
            smi.SmiDevice(GPU1, "CUDA GPU", "x", 40 * GIB, 40 * GIB, 108),
            "77.9",
            "1.0",
            77,
            40960,
            id="whole-device",
        ),
    ],
)
def test_utilisation_is_scaled_by_the_share_held(
    device: smi.SmiDevice,
    util: str,
    mem_fraction: str,
    expected_util: int,
    expected_used_mib: int,
) -> None:
    v = view(device, smi.SmiReading(D(util), D(mem_fraction)))
    assert v.util_percent(device) == expected_util
    assert v.memory_used_mib(device) == expected_used_mib


@pytest.mark.parametrize(
    ("device", "allocated", "util", "mem_fraction", "expected_util", "expected_used_mib"),
    [
        # Alone on the device: the whole (allocation-driven) load is the session's.
        pytest.param(HALF, "0.5", "93.0", "0.25", 93, 512, id="half-share-alone"),
        # Another session holds the other half: half the load and memory are this one's.
        pytest.param(HALF, "1", "93.0", "0.25", 46, 256, id="half-share-of-a-full-device"),
        pytest.param(
            smi.SmiDevice(GPU1, "CUDA GPU", "x", 5 * GIB, 40 * GIB, 21, D("2.7"), D("13.50")),
            "0.2",
            "18.0",
            "0.1",
            18,
            4096,  # 10 % of the 40 GiB device, all of it this session's
            id="2.7-of-13.5-alone",
        ),
        pytest.param(
            smi.SmiDevice(GPU1, "CUDA GPU", "x", 5 * GIB, 40 * GIB, 21, D("2.7"), D("13.50")),
            "0.2",
            "18.0",
            "0.9",
            18,
            5120,  # never more than the 5 GiB it holds
            id="2.7-of-13.5-capped",
        ),
        pytest.param(
            smi.SmiDevice(GPU1, "CUDA GPU", "x", 40 * GIB, 40 * GIB, 108),
            "1",
            "77.9",
            "0.5",
            77,
            20480,
            id="whole-device",
        ),
    ],
)
def test_mock_readings_are_the_sessions_part_of_what_is_allocated(
    device: smi.SmiDevice,
    allocated: str,
    util: str,
    mem_fraction: str,
    expected_util: int,
    expected_used_mib: int,
) -> None:
    reading = smi.SmiReading(D(util), D(mem_fraction), allocated=D(allocated))
    v = view(device, reading)
    assert v.util_percent(device) == expected_util
    assert v.memory_used_mib(device) == expected_used_mib


def test_the_stats_file_carries_the_allocated_fraction(tmp_path: Path) -> None:
    stats_file = tmp_path / smi.STATS_FILE
    mock = smi.SmiReading(D("40"), D("0.5"), D("200"), D("250"), D("90"), allocated=D("0.5"))
    real = smi.SmiReading(D("40"), D("0.5"))
    stats_file.write_text(smi.stats_json({GPU1: mock, GPU2: real}, at=1000.0))
    raw = json.loads(stats_file.read_text())["devices"]
    assert raw[GPU1]["allocated"] == "0.5"
    assert "allocated" not in raw[GPU2]  # measured readings: the old format
    plugin = MockPlugin(
        load_mock_config(SAMPLES / "two-fgpu.toml"), options(FRACTIONAL), stats_file=stats_file
    )
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.5"), GPU2: D("0.5")}})
    v = smi.read_view(env, now=1000.0)
    assert v.readings == {GPU1: mock, GPU2: real}


def test_without_readings_usage_is_zero_and_power_na() -> None:
    v = view(HALF)
    assert (v.util_percent(HALF), v.memory_used_mib(HALF)) == (0, 0)
    table = smi.render_table(v, now=0)
    assert "| N/A   N/A   P0                N/A / N/A |" in table
    assert "|       0MiB / 1024MiB |" in table
    assert smi.query_gpu(v, ["power.draw", "utilization.gpu"], "csv,noheader") == "[N/A], 0 %\n"


def test_the_table_keeps_its_box_shape() -> None:
    v = view(HALF, smi.SmiReading(D("40"), D("0.5"), D("201.4"), D("250"), D("88.7")))
    table = smi.render_table(v, now=0)
    box = [line for line in table.splitlines()[1:] if line[:1] in "+|"]
    assert {len(line) for line in box} == {89}
    assert "|   0  CUDA GPU                       On  | 00000000:99:00.0 Off |" in table
    assert "| N/A   88C   P0              201W / 250W |     512MiB / 1024MiB |" in table
    assert "|      20%     Default |" in table  # 40 % of the device, half of it held


def test_node_stats_reach_the_session_through_the_stats_file(tmp_path: Path) -> None:
    config = load_mock_config(SAMPLES / "two-fgpu.toml")
    stats_file = tmp_path / "scratch" / smi.STATS_FILE
    plugin = MockPlugin(config, options(FRACTIONAL), stats_file=stats_file)
    allocation = {"cuda.shares": {GPU1: D("0.5")}}
    env = session(tmp_path, plugin, allocation)
    assert query(env, "utilization.gpu,memory.used") == ["0, 0"]  # no tick yet
    plugin.observe_allocations({"k": allocation})  # what the agent does before a tick
    metrics = {m.key: m for m in asyncio.run(plugin.node_stats())}
    util = metrics["cuda_util"].per_device[GPU1].value
    used = metrics["cuda_mem"].per_device[GPU1].value
    assert util >= 35  # 0.5 × U(70, 100): the session's load
    # The session is all that is allocated on the device: its whole load and memory use
    # are the session's (memory within the 1 GiB it holds).
    expected_mib = int(min(used, D(GIB))) // 2**20
    assert query(env, "utilization.gpu,memory.used") == [f"{int(util)}, {expected_mib}"]


def test_stale_readings_are_not_shown(tmp_path: Path) -> None:
    stats_file = tmp_path / smi.STATS_FILE
    plugin = MockPlugin(
        load_mock_config(SAMPLES / "two-fgpu.toml"), options(FRACTIONAL), stats_file=stats_file
    )
    env = session(tmp_path, plugin, {"cuda.shares": {GPU1: D("0.5")}})
    reading = smi.SmiReading(D("80"), D("0.5"), D("200"), D("250"), D("90"))
    stats_file.write_text(smi.stats_json({GPU1: reading}, at=1000.0))
    fresh = smi.read_view(env, now=1000.0 + smi.STALE_AFTER_S)
    (device,) = fresh.devices
    assert (fresh.util_percent(device), fresh.memory_used_mib(device)) == (40, 512)
    stale = smi.read_view(env, now=1000.0 + smi.STALE_AFTER_S + 1)
    assert stale.readings == {}
    assert (stale.util_percent(device), stale.memory_used_mib(device)) == (0, 0)


# -- errors ---------------------------------------------------------------------------------


def test_an_unknown_field_exits_2_like_the_real_tool(tmp_path: Path) -> None:
    env = session(tmp_path, mock_plugin("two-fgpu.toml"), {"cuda.device": {GPU1: D(1)}})
    with pytest.raises(smi.SmiError) as caught:
        query(env, "index,clocks.bogus")
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith('Field "clocks.bogus" is not a valid field to query.')


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--query-gpu=index"], "Option --format is required"),
        (["--query-gpu=index", "--format=xml"], '"xml" is not a valid format'),
        (["--format=csv"], "--format needs --query-gpu"),
        (["--bogus"], 'Invalid combination of input arguments ("--bogus")'),
        (["--query-gpu"], "Option --query-gpu requires a value."),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    with pytest.raises(smi.SmiError) as caught:
        smi.run(args, {})
    assert caught.value.exit_code == 2
    assert message in str(caught.value)


def test_no_devices_exits_6_and_outside_a_session_exits_9(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = session(tmp_path, mock_plugin("two-fgpu.toml"), {"cuda.device": {GPU1: D(1)}})
    path = tmp_path / "config" / smi.DEVICES_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "devices": []}))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert smi.main([]) == 6
    assert capsys.readouterr().err == "No devices were found\n"
    monkeypatch.delenv(smi.RESOURCE_TXT_ENV)
    assert smi.main(["-L"]) == 9
    assert "couldn't communicate with the NVIDIA driver" in capsys.readouterr().err


def test_a_bad_devices_file_names_the_field_expected_and_received(tmp_path: Path) -> None:
    env = session(tmp_path, mock_plugin("two-fgpu.toml"), {"cuda.device": {GPU1: D(1)}})
    path = tmp_path / "config" / smi.DEVICES_FILE
    doc = json.loads(path.read_text())
    doc["devices"][0]["memory_bytes"] = "lots"
    path.write_text(json.dumps(doc))
    with pytest.raises(smi.SmiError) as caught:
        smi.run(["-L"], env)
    assert str(caught.value) == (
        f"{path}: field 'memory_bytes': expected an integer >= 0, received 'lots'"
    )


@pytest.mark.parametrize("path", ["", "/etc/x", "bin/../../x", "resource.txt", "bin//x"])
def test_config_file_paths_stay_inside_the_config_dir(path: str) -> None:
    with pytest.raises(ValueError, match=r"ConfigFile\.path"):
        ConfigFile(path, "")
