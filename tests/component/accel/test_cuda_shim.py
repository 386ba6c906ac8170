"""The CUDA memory interposer (accel/cuda/shim, accel/cuda/interposer.py) against a FAKE
libcuda.so.1 compiled here (cuda_shim/fake_libcuda.c: 80 GiB total, 79 GiB free), with
programs that reach cuMemGetInfo as the CUDA runtime does (dlopen + cuGetProcAddress)
and as a program linked with -lcuda does.  No GPU is involved: the real driver is
checked by tests/component/accel/test_cuda_real_mps.py on a GPU machine.  Skipped where
no C compiler is found."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelshare.accel.cuda.interposer import (
    SHIM_SOURCE,
    ShimUnavailable,
    build_shim,
    find_compiler,
    prepare_shim,
    shim_file_name,
)

HERE = Path(__file__).parent / "cuda_shim"
GIB = 2**30
MIB = 2**20
TOTAL, FREE = 80 * GIB, 79 * GIB
GPU0 = "GPU-00000000-1111-2222-3333-444444444444"  # the fake's device 0
GPU1 = "GPU-00000001-1111-2222-3333-444444444444"
MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler (cc / $CC)")


@dataclass(frozen=True)
class Built:
    shim: Path
    lib: Path  # the fake libcuda.so.1's folder
    lib_no_v2: Path  # a fake without cuDeviceGetUuid_v2
    cudart: Path
    linked: Path
    next_main: Path
    real: Path  # test_cuda_real_mps.py's program for the real driver


def cc(*args: str | Path) -> None:
    compiler = find_compiler()
    assert compiler is not None
    subprocess.run([*compiler, *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("shim")
    shim = build_shim(base / "shim")
    lib, lib_no_v2 = base / "lib", base / "lib-no-v2"
    for folder, extra in ((lib, ()), (lib_no_v2, ("-DNO_UUID_V2",))):
        folder.mkdir()
        cc(
            "-shared",
            "-fPIC",
            *extra,
            "-Wl,-soname,libcuda.so.1",
            "-o",
            folder / "libcuda.so.1",
            HERE / "fake_libcuda.c",
        )
    cc("-o", base / "cudart_like", HERE / "cudart_like.c", "-ldl")
    cc("-o", base / "linked", HERE / "linked.c", f"-L{lib}", "-l:libcuda.so.1")
    cc("-shared", "-fPIC", "-DWHICH='a'", "-o", lib / "libnext_a.so", HERE / "next.c", "-ldl")
    cc("-shared", "-fPIC", "-DWHICH='b'", "-o", lib / "libnext_b.so", HERE / "next.c")
    cc(
        "-o",
        base / "next_main",
        HERE / "next_main.c",
        f"-L{lib}",
        "-Wl,--no-as-needed",
        "-l:libnext_a.so",
        "-l:libnext_b.so",
    )
    cc("-o", base / "real_mem_info", HERE / "real_mem_info.c", "-ldl")
    return Built(
        shim,
        lib,
        lib_no_v2,
        base / "cudart_like",
        base / "linked",
        base / "next_main",
        base / "real_mem_info",
    )


def run(
    built: Built,
    how: str,
    *,
    limit: str | None = None,
    preload: bool = True,
    lib: Path | None = None,
    **extra: str,
) -> dict[str, int]:
    """``how``: a cudart_like mode (v2, v1, legacy, dlsym), ``linked`` or ``real`` (the
    real-GPU test's program, checked here against the fake); the figures it printed."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LD_LIBRARY_PATH": str(lib or built.lib)}
    if preload:
        env["LD_PRELOAD"] = str(built.shim)
    if limit is not None:
        env[MEM_ENV] = limit
    env.update(extra)
    programs = {"linked": [built.linked], "real": [built.real]}
    argv = [str(p) for p in programs.get(how, [built.cudart, how])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert done.stderr == ""
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done.stdout)}


MODES = ["v2", "v1", "dlsym", "linked", "real"]


@pytest.mark.parametrize("how", MODES)
def test_total_is_the_limit_of_the_current_device(built: Built, how: str) -> None:
    assert run(built, how, preload=False)["total"] == TOTAL  # the fake's own figures
    assert run(built, how, preload=False, limit=f"{GPU0}=20480M")["total"] == TOTAL
    seen = run(built, how, limit=f"{GPU0}=20480M")
    assert (seen["total"], seen["free"]) == (20 * GIB, 20 * GIB)
    # a limit above the free memory leaves free as it is
    seen = run(built, how, limit=f"{GPU1}=1G,{GPU0}=81000M")
    assert (seen["total"], seen["free"]) == (81000 * MIB, FREE)


@pytest.mark.parametrize("how", MODES)
def test_another_gpu_or_no_variable_changes_nothing(built: Built, how: str) -> None:
    for limit in (None, f"{GPU1}=1024M"):
        seen = run(built, how, limit=limit)
        assert (seen["total"], seen["free"]) == (TOTAL, FREE), limit
    seen = run(built, how, limit=f"{GPU1}=1024M", FAKE_CUDA_DEVICE="1")
    assert seen["total"] == GIB  # the same variable on device 1


@pytest.mark.parametrize(
    "limit",
    [
        "garbage",
        f"{GPU0}=",
        f"{GPU0}=10Q",
        f"{GPU0}=20480",  # no unit
        f"{GPU0}=20480M,",
        f"{GPU0}=1M,,",
        "=5M",
        "5M,6M",  # two defaults
        "GPU-0000-1111=5M",  # not a uuid
        f"{GPU0}=99999999999999999999G",
        "",
        ",",
    ],
)
def test_a_malformed_variable_changes_nothing_and_crashes_nothing(built: Built, limit: str) -> None:
    for how in ("v2", "linked"):
        seen = run(built, how, limit=limit)
        assert (seen["total"], seen["free"]) == (TOTAL, FREE)


def test_ordinals_a_default_and_mps_spellings(built: Built) -> None:
    assert run(built, "v2", limit="512M")["total"] == 512 * MIB  # every device
    assert run(built, "v2", limit=f"{GPU1}=1G,512M")["total"] == 512 * MIB
    assert run(built, "v2", limit=f"{GPU1}=1G,512M", FAKE_CUDA_DEVICE="1")["total"] == GIB
    assert run(built, "v2", limit="0=2G,1=3G")["total"] == 2 * GIB
    assert run(built, "v2", limit="0=2G,1=3G", FAKE_CUDA_DEVICE="1")["total"] == 3 * GIB
    lower = GPU0.lower().removeprefix("gpu-").upper()  # no prefix, upper case, spaces
    assert run(built, "v2", limit=f" {lower} = 4gb ".replace(" = ", "="))["total"] == 4 * GIB
    assert run(built, "v2", limit=f"{GPU0}=1T")["total"] == TOTAL  # above the GPU's


def test_the_legacy_32_bit_entry_point(built: Built) -> None:
    seen = run(built, "legacy", limit=f"{GPU0}=1024M")
    assert (seen["total"], seen["free"]) == (GIB, GIB)
    seen = run(built, "linked", limit=f"{GPU0}=1024M")
    assert (seen["total32"], seen["free32"]) == (GIB, GIB)
    seen = run(built, "legacy", limit=f"{GPU0}=8G")  # above its 3 GiB: unchanged
    assert (seen["total"], seen["free"]) == (3 * GIB, 2 * GIB)


def test_an_older_driver_and_no_context(built: Built) -> None:
    seen = run(built, "v2", limit=f"{GPU0}=2G", lib=built.lib_no_v2)  # cuDeviceGetUuid
    assert seen["total"] == 2 * GIB
    seen = run(built, "v2", limit=f"{GPU0}=2G", FAKE_CUDA_NO_CONTEXT="1")
    assert (seen["total"], seen["free"]) == (TOTAL, FREE)


def test_rtld_next_keeps_its_meaning_for_other_libraries(built: Built) -> None:
    """The shim's dlsym forwards by a sibling call: the real dlsym sees the caller's
    address, so dlsym(RTLD_NEXT, ...) from a library still finds the next one's."""
    env = {"LD_LIBRARY_PATH": str(built.lib), "LD_PRELOAD": str(built.shim)}
    done = subprocess.run(
        [str(built.next_main)], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout == "b\n"


def test_other_programs_run_as_before(built: Built) -> None:
    env = {**os.environ, "LD_PRELOAD": str(built.shim), MEM_ENV: f"{GPU0}=1G"}
    code = "import ctypes, ctypes.util, json; print(json.dumps({'ok': 1}))"
    done = subprocess.run(
        [shutil.which("python3") or "python3", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == '{"ok": 1}\n'
    assert done.stderr == ""


def test_the_library_needs_no_newer_glibc_than_the_oldest_images(built: Built) -> None:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump")
    table = subprocess.run(
        [objdump, "-T", str(built.shim)], capture_output=True, text=True, check=True
    )
    versions = set(re.findall(r"GLIBC_(\d+)\.(\d+)", table.stdout))
    assert versions, table.stdout
    assert all((int(a), int(b)) <= (2, 17) for a, b in versions), versions
    exported = set(re.findall(r"\.text\s+\S+\s+(?:Base\s+)?(\w+)$", table.stdout, re.M))
    assert exported == {
        "dlsym",
        "cuMemGetInfo",
        "cuMemGetInfo_v2",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
    }


# -- the builder ---------------------------------------------------------------------------


def test_the_build_is_cached_by_the_source_hash(tmp_path: Path) -> None:
    folder = tmp_path / "shim"
    first = build_shim(folder)
    assert first.name == shim_file_name(SHIM_SOURCE.read_bytes())
    assert first.stat().st_mode & 0o777 == 0o755
    assert folder.stat().st_mode & 0o777 == 0o755
    # the same source again: no compiler run (one that would fail is not called)
    assert build_shim(folder, env={**os.environ, "CC": "/bin/false"}) == first
    changed = tmp_path / "changed.c"
    changed.write_bytes(SHIM_SOURCE.read_bytes() + b"\n/* another version */\n")
    second = build_shim(folder, source=changed)
    assert second != first
    assert sorted(p.name for p in folder.iterdir()) == sorted([first.name, second.name])


def test_a_failed_build_is_reported_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "shim"
    with pytest.raises(ShimUnavailable, match=r"/bin/false .* exited with 1"):
        build_shim(folder, env={**os.environ, "CC": "/bin/false"})
    assert list(folder.iterdir()) == []  # no partial file left
    with pytest.raises(ShimUnavailable, match="no C compiler: 'no-such-cc'"):
        build_shim(folder, env={**os.environ, "CC": "no-such-cc"})
    with caplog.at_level(logging.WARNING, logger="accelshare.accel.cuda.interposer"):
        state = prepare_shim(folder, env={**os.environ, "CC": "/bin/false"})
    assert state.path is None
    [record] = caplog.records
    assert "memory interposer was not built" in record.getMessage()
    assert "\n" not in record.getMessage().split(": /bin/false")[0]
    assert state.status()["shim"].startswith("none (/bin/false ")
    assert state.status()["shim"].endswith("cudaMemGetInfo's total stays the whole GPU's")
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    with pytest.raises(ShimUnavailable, match=r"exited with 1: .*error"):
        build_shim(folder, source=broken)
    assert list(folder.iterdir()) == []
