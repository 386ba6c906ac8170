"""The MPS limits of fractional CUDA shares (pure): thread percentage, memory, env."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.accel import ComputePlugin, KernelResources, merge_kernel_env
from accelshare.accel.accelerator import Held
from accelshare.accel.cuda.interposer import ShimState, shim_file_name
from accelshare.accel.cuda.mps import (
    MPS_MEM_ENV,
    MPS_PIPE_ENV,
    MPS_THREADS_ENV,
    MpsShare,
    active_thread_percentage,
    find_control_program,
    mps_client_env,
    mps_directories,
    mps_shares,
)
from accelshare.accel.options import AcceleratorOptions
from accelshare.accel.types import Device
from accelshare.agent.launch import build_kernel_spec
from accelshare.common import AllocationMode, SlotTypes
from accelshare.protocol import CreateKernelRequest

GIB = 2**30
MIB = 2**20


def gpu(device_id: str, processors: int = 132, slot: str = "cuda.shares") -> Device:
    return Device(
        device_id=device_id,
        slot_name=slot,
        capacity=Decimal(1),
        model_name="NVIDIA H200",
        numa_node=0,
        memory_bytes=140 * GIB,
        processors=processors,
        hw_location="0000:00:06.0",
    )


def fractional(unit_mem: int = 2 * GIB, unit_proc: int = 8) -> AcceleratorOptions:
    return AcceleratorOptions(
        allocation_mode=AllocationMode.FRACTIONAL, unit_mem=unit_mem, unit_proc=unit_proc
    )


@pytest.mark.parametrize(
    ("shares", "unit_proc", "sms", "expected"),
    [
        ("0.25", 132, 132, 25),  # a GPU configured as 1.0 share: a quarter of it
        ("1", 132, 132, 100),
        ("0.5", 8, 132, 4),  # 4 of 132 SMs is 3.03 %: rounded up
        ("0.01", 8, 132, 1),  # 0.08 SM: at least 1 %
        ("16.5", 8, 132, 100),  # the whole H200 in default units
        ("0.33", 100, 100, 33),
        ("0.333", 100, 100, 34),
    ],
)
def test_active_thread_percentage(shares: str, unit_proc: int, sms: int, expected: int) -> None:
    assert active_thread_percentage(Decimal(shares), unit_proc, sms) == expected


@pytest.mark.parametrize(("shares", "sms"), [("0", 132), ("-0.5", 132), ("0.5", 0)])
def test_active_thread_percentage_refuses_what_it_cannot_enforce(shares: str, sms: int) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        active_thread_percentage(Decimal(shares), 8, sms)


@given(
    hundredths=st.integers(min_value=1, max_value=100_000),
    unit_proc=st.integers(min_value=1, max_value=256),
    sms=st.integers(min_value=1, max_value=1024),
)
def test_percentage_covers_the_share_and_no_more_than_one_percent_over(
    hundredths: int, unit_proc: int, sms: int
) -> None:
    shares = Decimal(hundredths) / 100
    wanted = shares * unit_proc  # SMs the share is worth
    percent = active_thread_percentage(shares, unit_proc, sms)
    assert 1 <= percent <= 100
    if wanted <= sms:  # within one GPU: never less than the share, at most 1 % over
        assert Decimal(percent) * sms / 100 >= wanted
        assert percent == 1 or Decimal(percent - 1) * sms / 100 < wanted
    else:
        assert percent == 100


def test_only_fractional_shares_get_limits() -> None:
    options = fractional(unit_mem=140 * GIB, unit_proc=132)
    held = [
        Held(gpu("GPU-a"), "cuda.shares", Decimal("0.25")),
        Held(gpu("MIG-b", slot="cuda.device:1g.18gb-mig"), "cuda.device:1g.18gb-mig", Decimal(1)),
        Held(gpu("GPU-c", processors=66), "cuda.shares", Decimal("0.5")),
    ]
    assert mps_shares(held, options) == (
        MpsShare("GPU-a", 35 * GIB, 25),
        MpsShare("GPU-c", 70 * GIB, 100),  # 0.5 x 132 SMs is more than GPU-c's 66
    )


def test_client_env_names_gpus_by_uuid_in_whole_mib_rounded_down(tmp_path: Path) -> None:
    shares = (
        MpsShare("GPU-a", 35 * GIB, 25),
        MpsShare("GPU-b", 3 * MIB + 12345, 40),  # not a whole MiB: 3M, never 4M
    )
    assert mps_client_env(shares, tmp_path / "pipe") == {
        MPS_PIPE_ENV: str(tmp_path / "pipe"),
        MPS_MEM_ENV: "GPU-a=35840M,GPU-b=3M",
        MPS_THREADS_ENV: "40",  # one value for all GPUs of the kernel: the largest
    }
    assert mps_client_env((), tmp_path) == {}


@given(memory=st.integers(min_value=MIB, max_value=2**50))
def test_memory_limit_is_never_above_the_share(memory: int) -> None:
    env = mps_client_env((MpsShare("GPU-a", memory, 10),), Path("/p"))
    mib = int(env[MPS_MEM_ENV].removeprefix("GPU-a=").removesuffix("M"))
    assert mib * MIB <= memory < (mib + 1) * MIB


def test_directories_stay_short_enough_for_the_daemon_sockets() -> None:
    assert mps_directories(Path("/var/lib/accelshare/.mps")) == (
        Path("/var/lib/accelshare/.mps/pipe"),
        Path("/var/lib/accelshare/.mps/log"),
    )
    deep = Path("/" + "/".join(["very-long-folder-name"] * 5)) / ".mps"
    pipe, log = mps_directories(deep)
    assert pipe.parent == log.parent
    assert pipe.parent.parent == Path("/tmp")
    assert (pipe.name, log.name) == ("pipe", "log")
    assert len(str(pipe) + "/control_privileged") <= 100
    assert mps_directories(deep) == (pipe, log)  # the same folder for the same base
    assert mps_directories(deep / "other")[0] != pipe
    assert mps_directories(deep, tmp_root=Path("/run"))[0].parent.parent == Path("/run")


def test_the_control_program_is_found_by_path_name_or_driver_folder(tmp_path: Path) -> None:
    program = tmp_path / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    assert find_control_program(str(program)) is None  # not executable
    program.chmod(0o755)
    assert find_control_program(str(program)) == program
    assert find_control_program("nvidia-cuda-mps-control", path=str(program.parent)) == program
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "nvidia-cuda-mps-control").symlink_to(program)
    found = find_control_program("nvidia-cuda-mps-control", search_dirs=[str(driver)], path="")
    assert found == driver / "nvidia-cuda-mps-control"
    assert find_control_program("nvidia-cuda-mps-control", search_dirs=[], path="") is None


# -- the memory interposer's LD_PRELOAD ---------------------------------------------------


def test_a_plugins_ld_preload_goes_before_the_requests_own() -> None:
    env = {"LD_PRELOAD": "/opt/mine.so", "A": "1"}
    merge_kernel_env(env, {"LD_PRELOAD": "/x/shim.so", "A": "2", "B": "3"})
    assert env == {"LD_PRELOAD": "/x/shim.so:/opt/mine.so", "A": "2", "B": "3"}
    empty = {"LD_PRELOAD": " "}
    merge_kernel_env(empty, {"LD_PRELOAD": "/x/shim.so"})
    assert empty == {"LD_PRELOAD": "/x/shim.so"}


def test_the_kernel_spec_keeps_a_requested_ld_preload_after_the_shim() -> None:
    class Stub:
        def kernel_resources(self, allocation: object) -> KernelResources:
            return KernelResources(env={"LD_PRELOAD": "/x/shim.so"})

    request = CreateKernelRequest(
        kernel_id="k1",
        session_id="s1",
        image="python",
        requested_slots={"cuda.shares": "0.5"},
        environ={"LD_PRELOAD": "/opt/mine.so"},
    )
    plugins = cast(dict[str, ComputePlugin], {"cuda": Stub()})
    allocation = {"cuda": {"cuda.shares": {"GPU-a": Decimal("0.5")}}}
    spec, _ = build_kernel_spec(
        request,
        {"cuda.shares": Decimal("0.5")},
        allocation,
        plugins,
        {"cuda.shares": SlotTypes.COUNT},
    )
    assert spec.env["LD_PRELOAD"] == "/x/shim.so:/opt/mine.so"


def test_the_interposer_state_for_agent_info() -> None:
    ready = ShimState(path=Path("/s/.mps/shim/libaccelshare-cuda-shim-0123.so"))
    assert ready.status() == {
        "shim": "ready (cudaMemGetInfo's total = the kernel's memory limit)",
        "shim_path": "/s/.mps/shim/libaccelshare-cuda-shim-0123.so",
    }
    missing = ShimState(reason="no C compiler: 'cc' was not found")
    assert missing.status()["shim"] == (
        "none (no C compiler: 'cc' was not found): cudaMemGetInfo's total stays the whole GPU's"
    )
    assert shim_file_name(b"a").startswith("libaccelshare-cuda-shim-")
    assert shim_file_name(b"a") != shim_file_name(b"b")
    assert shim_file_name(b"a").endswith(".so")
