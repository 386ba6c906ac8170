"""The CUDA memory interposer: ``cudaMemGetInfo``'s *total* = a kernel's memory limit.

Under MPS a kernel holding ``s`` shares of a GPU sees at most its pinned memory limit
as *free* memory, but the whole GPU as *total* (``torch.cuda.mem_get_info``).  The agent
compiles ``shim/accelshare_cuda_shim.c`` (shipped with the package) at start, in
fractional mode with ``[cuda] enforce = "mps"``, and kernels holding shares get it as
``LD_PRELOAD``: the driver's ``cuMemGetInfo`` then reports
``total = min(total, limit)`` and ``free = min(free, limit)`` for the current context's
GPU, the limit read from ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` as MPS reads it.  The C
source says how calls reach it (``dlsym`` and ``cuGetProcAddress`` are wrapped: the CUDA
runtime gets every driver function through them).

The library is built with ``cc`` (``$CC`` when set) into
``<mps-dir>/shim/libaccelshare-cuda-shim-<hash>.so``, the hash of the source and the
flags: an agent rebuilds it only when they change, and an older one is left in place
for the kernels that still name it.  It is written under a temporary name and renamed,
so a kernel never sees half a file.  No compiler or a failed build: the agent logs one
line, kernels run without it (their *total* stays the GPU's) and ``agent info`` says so
(``cuda shim``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CFLAGS",
    "LIBS",
    "PRELOAD_ENV",
    "SHIM_PREFIX",
    "SHIM_SOURCE",
    "ShimState",
    "ShimUnavailable",
    "build_shim",
    "find_compiler",
    "prepare_shim",
    "shim_file_name",
]

log = logging.getLogger(__name__)

SHIM_SOURCE = Path(__file__).parent / "shim" / "accelshare_cuda_shim.c"
SHIM_PREFIX = "libaccelshare-cuda-shim-"
PRELOAD_ENV = "LD_PRELOAD"
# -fno-delete-null-pointer-checks: glibc declares dlsym's name non-null, and the shim's
# dlsym checks it all the same.
CFLAGS = (
    "-shared",
    "-fPIC",
    "-O2",
    "-fvisibility=hidden",
    "-fno-delete-null-pointer-checks",
    "-Wall",
)
LIBS = ("-ldl",)
_BUILD_TIMEOUT_S = 120.0
_OUTPUT_TAIL = 400


class ShimUnavailable(RuntimeError):
    """The interposer cannot be built (no compiler, a failed compile); ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class ShimState:
    """The agent's interposer: the library (None: kernels run without it) or why not."""

    path: Path | None = None
    reason: str = ""

    def status(self) -> dict[str, str]:
        """``shim`` (one line for ``agent info``) and ``shim_path``."""
        if self.path is not None:
            return {
                "shim": "ready (cudaMemGetInfo's total = the kernel's memory limit)",
                "shim_path": str(self.path),
            }
        return {
            "shim": f"none ({self.reason}): cudaMemGetInfo's total stays the whole GPU's",
            "shim_path": "",
        }


def shim_file_name(source: bytes) -> str:
    """``libaccelshare-cuda-shim-<16 hex digits>.so``: the hash of ``source`` and the flags."""
    digest = hashlib.sha256(source)
    digest.update(" ".join((*CFLAGS, *LIBS)).encode())
    return f"{SHIM_PREFIX}{digest.hexdigest()[:16]}.so"


def find_compiler(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The C compiler's argv: ``$CC`` (split as a shell would) or ``cc``; None when its
    program is not found."""
    environ = os.environ if env is None else env
    argv = shlex.split(environ.get("CC", "")) or ["cc"]
    found = shutil.which(argv[0], path=environ.get("PATH", os.defpath))
    return [found, *argv[1:]] if found is not None else None


def build_shim(
    folder: Path,
    *,
    source: Path = SHIM_SOURCE,
    env: Mapping[str, str] | None = None,
    timeout_s: float = _BUILD_TIMEOUT_S,
) -> Path:
    """The interposer in ``folder``, compiled unless a build of the same source and flags
    is there already (I/O, blocking); :class:`ShimUnavailable` naming why it cannot be."""
    try:
        text = source.read_bytes()
    except OSError as e:
        raise ShimUnavailable(f"its source {source} cannot be read ({e})") from e
    target = folder / shim_file_name(text)
    if target.is_file():
        return target
    compiler = find_compiler(env)
    if compiler is None:
        name = (env if env is not None else os.environ).get("CC") or "cc"
        raise ShimUnavailable(f"no C compiler: {name!r} was not found (install gcc, or set CC)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)  # kernels of other users load it
    except OSError as e:
        raise ShimUnavailable(f"its folder {folder} cannot be made ({e})") from e
    partial = folder / f".{target.name}.{os.getpid()}.tmp"
    argv = [*compiler, *CFLAGS, "-o", str(partial), str(source), *LIBS]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
            env=dict(env) if env is not None else None,
        )
        if done.returncode != 0:
            output = done.stdout.decode(errors="replace").strip()
            tail = output[-_OUTPUT_TAIL:] if output else "no output"
            raise ShimUnavailable(f"{shlex.join(argv)} exited with {done.returncode}: {tail}")
        partial.chmod(0o755)
        os.replace(partial, target)
    except subprocess.TimeoutExpired as e:
        raise ShimUnavailable(f"{compiler[0]} took more than {timeout_s:g} s") from e
    except OSError as e:
        raise ShimUnavailable(f"{compiler[0]} could not build it ({e})") from e
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    return target


def prepare_shim(folder: Path, *, env: Mapping[str, str] | None = None) -> ShimState:
    """:func:`build_shim`, logged: the state the plugin keeps (never raises
    :class:`ShimUnavailable`)."""
    try:
        path = build_shim(folder, env=env)
    except ShimUnavailable as e:
        log.warning(
            "cuda: the memory interposer was not built (%s); kernels holding shares run "
            "without it: cudaMemGetInfo reports the whole GPU as their total memory",
            e,
        )
        return ShimState(reason=str(e))
    log.info("cuda: memory interposer ready: %s", path)
    return ShimState(path=path)
