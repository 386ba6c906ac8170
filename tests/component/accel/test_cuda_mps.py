"""The cuda plugin's MPS control daemon, against a fake ``nvidia-cuda-mps-control`` that
records its calls (accelshare_testkit.fake_mps): start, adopt, supervise, quit, and
what fractional kernels get.  The real daemon is checked on a GPU by
tests/component/accel/test_cuda_real_mps.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from accelshare.accel import PluginConfigError, PluginContext
from accelshare.accel.cuda import LibcudaDriver, PynvmlLayer
from accelshare.accel.cuda import create_plugin as create_cuda_plugin
from accelshare.accel.cuda.fake import FakeGpu, FakeNvml
from accelshare.accel.cuda.interposer import find_compiler
from accelshare.accel.cuda.mps import MpsDaemon, MpsUnavailable
from accelshare.accel.cuda.plugin import CudaPlugin
from accelshare.config import ConfigStore, open_config_store
from accelshare.config.agent_file import parse_agent_config
from accelshare.config.settings import ConfigStoreSettings, EmbeddedSettings
from accelshare_testkit.fake_mps import install_fake_mps_control, read_calls

GIB = 2**30


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


async def until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {check}")
        await asyncio.sleep(0.02)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    return install_fake_mps_control(tmp_path / "bin")


@pytest.fixture
async def daemons() -> AsyncIterator[list[MpsDaemon]]:
    """Daemons the test starts; any still running at the end is quit."""
    started: list[MpsDaemon] = []
    yield started
    for daemon in started:
        if daemon.pid is not None and alive(daemon.pid):
            await daemon.quit()


def make_daemon(program: Path, base: Path, started: list[MpsDaemon], **kw: Any) -> MpsDaemon:
    daemon = MpsDaemon(program, base / "pipe", base / "log", **kw)
    started.append(daemon)
    return daemon


async def test_start_runs_the_daemon_with_its_directories_and_gpus(
    program: Path, tmp_path: Path, daemons: list[MpsDaemon]
) -> None:
    daemon = make_daemon(program, tmp_path / "mps", daemons, devices=["GPU-a", "GPU-b"])
    await daemon.start()
    assert daemon.pid is not None
    assert alive(daemon.pid)
    assert daemon.status()["state"] == "running"
    assert daemon.status()["adopted"] == "no"
    [call] = read_calls(daemon.log_dir)
    assert call["argv"] == ["-d"]
    assert call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
    assert call["env"]["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps" / "log")
    assert call["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert (daemon.pipe_dir.stat().st_mode & 0o777) == 0o755  # other users' kernels reach it
    assert await daemon.command("get_server_list") == ""


async def test_a_second_agent_adopts_the_running_daemon(
    program: Path, tmp_path: Path, daemons: list[MpsDaemon]
) -> None:
    first = make_daemon(program, tmp_path, daemons)
    await first.start()
    second = make_daemon(program, tmp_path, daemons)
    await second.start()
    assert second.pid == first.pid
    assert second.status()["adopted"] == "yes"
    assert [c["argv"] for c in read_calls(first.log_dir)] == [["-d"]]  # not started twice


async def test_a_dead_daemon_is_started_again_and_counted(
    program: Path, tmp_path: Path, daemons: list[MpsDaemon], caplog: pytest.LogCaptureFixture
) -> None:
    daemon = make_daemon(program, tmp_path, daemons, check_interval_s=0.05)
    await daemon.start()
    first_pid = daemon.pid
    assert first_pid is not None
    daemon.supervise()
    os.kill(first_pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="accelshare.accel.cuda.mps"):
        await until(lambda: daemon.restarts == 1 and daemon.state == "running")
    assert daemon.pid not in (None, first_pid)
    assert alive(daemon.pid)
    assert [c["argv"] for c in read_calls(daemon.log_dir)] == [["-d"], ["-d"]]
    assert "died; starting it again" in caplog.text
    await daemon.close()  # no client: quits it
    assert daemon.status()["state"] == "stopped"


async def test_close_quits_an_idle_daemon_but_leaves_one_with_clients(
    program: Path, tmp_path: Path, daemons: list[MpsDaemon]
) -> None:
    daemon = make_daemon(program, tmp_path, daemons)
    await daemon.start()
    pid = daemon.pid
    assert pid is not None
    (daemon.log_dir / "fake-servers").write_text("4242\n")
    (daemon.log_dir / "fake-clients-4242").write_text("1001\n1002\n")
    assert await daemon.client_count() == 2
    await daemon.close()
    assert alive(pid), "running kernels keep the daemon for the next agent"
    (daemon.log_dir / "fake-clients-4242").write_text("")
    await daemon.close()
    await until(lambda: not alive(pid))
    commands = [c["commands"] for c in read_calls(daemon.log_dir) if c["commands"]]
    assert commands[-1] == ["quit"]
    assert daemon.status()["state"] == "stopped"


async def test_a_refused_start_says_why_with_the_daemon_log(
    program: Path, tmp_path: Path, daemons: list[MpsDaemon]
) -> None:
    daemon = make_daemon(program, tmp_path, daemons)
    daemon.log_dir.mkdir(parents=True)
    (daemon.log_dir / "control.log").write_text("[fake] NVML: driver not loaded\n")
    (daemon.log_dir / "fake-refuse-start").write_text("Failed to start the MPS daemon")
    with pytest.raises(MpsUnavailable, match="exited with 1: Failed to start") as info:
        await daemon.start()
    assert "driver not loaded" in str(info.value)  # the daemon's own words
    assert daemon.status()["state"] == "failed"
    missing = make_daemon(tmp_path / "nowhere", tmp_path / "other", daemons)
    with pytest.raises(MpsUnavailable, match="could not run"):
        await missing.start()


# -- the plugin: options from a real store, NVML from a fake machine ----------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ConfigStore]:
    settings = ConfigStoreSettings(embedded=EmbeddedSettings(path=tmp_path / "store.db"))
    opened = await open_config_store(settings, scaling_group="default", node_id="i-gpu")
    await opened.put("config/plugins/accelerator/cuda/allocation_mode", "fractional")
    await opened.put("config/plugins/accelerator/cuda/unit_mem", str(80 * GIB))
    await opened.put("config/plugins/accelerator/cuda/unit_proc", "132")
    yield opened
    await opened.close()


async def plugin_for(
    store: ConfigStore, tmp_path: Path, cuda: dict[str, Any], *, manage: bool = True
) -> CudaPlugin:
    """An H100 (80 GiB, 132 SMs: 1.00 share in these units) and a MIG-split A100."""
    nvml = FakeNvml([FakeGpu.h100(0), FakeGpu.a100(1, mig=["1g.5gb", "3g.20gb"])])
    config = parse_agent_config(
        {"container": {"scratch-root": str(tmp_path / "scratch")}, "cuda": cuda}
    )
    return await create_cuda_plugin(
        PluginContext(config, store, manage_services=manage),
        nvml=PynvmlLayer(nvml),
        driver=LibcudaDriver(loader=nvml.libcuda().load),
    )


def allocation(plugin: CudaPlugin, shares: str) -> dict[str, dict[str, Any]]:
    from decimal import Decimal

    h100 = next(d for d in plugin.inventory.devices if d.slot_name == "cuda.shares")
    return {"cuda.shares": {h100.device_id: Decimal(shares)}}


async def test_fractional_kernels_get_their_limits_through_the_agents_daemon(
    store: ConfigStore, tmp_path: Path, program: Path
) -> None:
    plugin = await plugin_for(
        store, tmp_path, {"mps-control": str(program), "mps-dir": str(tmp_path / "mps")}
    )
    try:
        assert plugin.mps is not None
        assert plugin.mps.pid is not None
        pid = plugin.mps.pid
        assert plugin.inventory.extra_info["fraction_enforcement"] == "mps"
        status = plugin.status()
        assert status["enforcement"] == "mps"
        assert status["mps"] == f"running (pid {pid}, 0 restarts)"
        h100 = next(d for d in plugin.inventory.devices if d.slot_name == "cuda.shares")
        [call] = read_calls(tmp_path / "mps" / "log")
        assert call["env"]["CUDA_VISIBLE_DEVICES"] == h100.device_id  # not the MIG parent
        res = plugin.kernel_resources(allocation(plugin, "0.25"))
        assert res.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
        assert res.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{h100.device_id}=20480M"
        assert res.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert res.env["CUDA_VISIBLE_DEVICES"] == h100.device_id
        assert res.ipc_host
        assert (res.mounts[0].source, res.mounts[0].target, res.mounts[0].read_only) == (
            str(tmp_path / "mps" / "pipe"),
            str(tmp_path / "mps" / "pipe"),
            False,
        )
        mig = next(d for d in plugin.inventory.devices if d.is_mig)
        whole = plugin.kernel_resources({mig.slot_name: {mig.device_id: 1}})  # type: ignore[dict-item]
        assert not any(k.startswith("CUDA_MPS_") for k in whole.env)
        assert "LD_PRELOAD" not in whole.env
        assert not whole.ipc_host
        assert not whole.mounts
    finally:
        await plugin.close()
    await until(lambda: not alive(pid))  # no client: the agent's stop quits it


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler (cc / $CC)")
async def test_kernels_holding_shares_preload_the_memory_interposer(
    store: ConfigStore, tmp_path: Path, program: Path
) -> None:
    plugin = await plugin_for(
        store, tmp_path, {"mps-control": str(program), "mps-dir": str(tmp_path / "mps")}
    )
    try:
        assert plugin.shim is not None
        shim = plugin.shim.path
        assert shim is not None
        assert shim.parent == tmp_path / "mps" / "shim"
        assert shim.name.startswith("libaccelshare-cuda-shim-")
        status = plugin.status()
        assert status["shim_path"] == str(shim)
        assert status["shim"].startswith("ready")
        res = plugin.kernel_resources(allocation(plugin, "0.25"))
        assert res.env["LD_PRELOAD"] == str(shim)
        folder = str(shim.parent)
        assert [(m.source, m.target, m.read_only) for m in res.mounts] == [
            (str(tmp_path / "mps" / "pipe"), str(tmp_path / "mps" / "pipe"), False),
            (folder, folder, True),  # read-only, at the same path in containers
        ]
    finally:
        await plugin.close()
    # without MPS (advisory fractions) or outside the agent: no interposer
    off = await plugin_for(store, tmp_path, {"mps-control": str(program), "enforce": "none"})
    inspect = await plugin_for(store, tmp_path, {"mps-control": str(program)}, manage=False)
    try:
        for other in (off, inspect):
            assert other.shim is None
            assert "shim" not in other.status()
            assert "LD_PRELOAD" not in other.kernel_resources(allocation(other, "0.25")).env
    finally:
        await off.close()
        await inspect.close()


async def test_without_a_compiler_kernels_run_without_the_interposer(
    store: ConfigStore,
    tmp_path: Path,
    program: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger="accelshare.accel.cuda.interposer"):
        plugin = await plugin_for(
            store, tmp_path, {"mps-control": str(program), "mps-dir": str(tmp_path / "mps")}
        )
    try:
        assert plugin.enforcement == "mps"  # MPS still enforces the limits
        status = plugin.status()
        assert status["shim"].startswith("none (no C compiler: ")
        assert status["shim_path"] == ""
        assert "memory interposer was not built" in caplog.text
        res = plugin.kernel_resources(allocation(plugin, "0.25"))
        assert "LD_PRELOAD" not in res.env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in res.env
        assert len(res.mounts) == 1
    finally:
        await plugin.close()


async def test_without_mps_the_agent_warns_and_runs_advisory_fractions(
    store: ConfigStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="accelshare.accel.cuda.plugin"):
        plugin = await plugin_for(store, tmp_path, {"mps-control": str(tmp_path / "missing")})
    try:
        assert plugin.mps is None
        assert plugin.enforcement.startswith("none (MPS unavailable: ")
        assert "FRACTIONAL SHARES ARE NOT ENFORCED" in caplog.text
        res = plugin.kernel_resources(allocation(plugin, "0.5"))
        assert not any(k.startswith("CUDA_MPS_") for k in res.env)
        assert not res.ipc_host
        assert res.resource_lines["CUDA_RESOURCE_VIRTUALIZED"] == "1"  # limits still written
    finally:
        await plugin.close()


async def test_mps_missing_refuse_stops_the_agent_naming_the_key(
    store: ConfigStore, tmp_path: Path
) -> None:
    with pytest.raises(PluginConfigError) as info:
        await plugin_for(
            store, tmp_path, {"mps-control": str(tmp_path / "missing"), "mps-missing": "refuse"}
        )
    assert info.value.key == "cuda.mps-missing"
    assert "was not found" in str(info.value)


async def test_no_daemon_where_nothing_is_shared_or_enforcement_is_off(
    store: ConfigStore, tmp_path: Path, program: Path
) -> None:
    log_dir = tmp_path / "mps" / "log"
    cuda = {"mps-control": str(program), "mps-dir": str(tmp_path / "mps")}
    off = await plugin_for(store, tmp_path, {**cuda, "enforce": "none"})
    inspect = await plugin_for(store, tmp_path, cuda, manage=False)  # `agent plugins`
    await store.put("config/plugins/accelerator/cuda/allocation_mode", "discrete")
    discrete = await plugin_for(store, tmp_path, cuda)
    try:
        assert off.mps is None
        assert off.enforcement.startswith("none ([cuda] enforce")
        assert inspect.mps is None
        assert inspect.enforcement == "mps (started by the agent)"
        assert discrete.mps is None
        assert discrete.status() == {}
        assert read_calls(log_dir) == []  # none of them ran the program
    finally:
        for plugin in (off, inspect, discrete):
            await plugin.close()


async def test_supervision_survives_an_unexpected_error(
    program: Path,
    tmp_path: Path,
    daemons: list[MpsDaemon],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = make_daemon(program, tmp_path, daemons, check_interval_s=0.02)
    await daemon.start()
    calls = 0
    real_check = daemon.check

    async def flaky() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("a passing failure")
        return await real_check()

    monkeypatch.setattr(daemon, "check", flaky)
    with caplog.at_level(logging.ERROR, logger="accelshare.accel.cuda.mps"):
        daemon.supervise()
        await until(lambda: calls >= 3)  # it went on checking after the error
    assert "checking the MPS control daemon failed" in caplog.text
    await daemon.close()
