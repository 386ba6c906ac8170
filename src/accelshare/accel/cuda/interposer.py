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

The library is built (:mod:`accelshare.cbuild`) with ``cc`` (``$CC`` when set) into
``<mps-dir>/shim/libaccelshare-cuda-shim-<hash>.so``, the hash of the source and the
flags: an agent rebuilds it only when they change, and an older one is left in place
for the kernels that still name it.  It is written under a temporary name and renamed,
so a kernel never sees half a file.  No compiler or a failed build: the agent logs one
line, kernels run without it (their *total* stays the GPU's) and ``agent info`` says so
(``cuda shim``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accelshare.cbuild import BUILD_TIMEOUT_S, BuildFailed, build, build_name, find_compiler

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
_BUILD_TIMEOUT_S = BUILD_TIMEOUT_S


class ShimUnavailable(BuildFailed):
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
    return build_name(SHIM_PREFIX, ".so", source, (*CFLAGS, *LIBS))


def build_shim(
    folder: Path,
    *,
    source: Path = SHIM_SOURCE,
    env: Mapping[str, str] | None = None,
    timeout_s: float = _BUILD_TIMEOUT_S,
) -> Path:
    """The interposer in ``folder``, compiled unless a build of the same source and flags
    is there already (I/O, blocking; :func:`accelshare.cbuild.build`);
    :class:`ShimUnavailable` naming why it cannot be."""
    try:
        return build(
            source,
            folder,
            prefix=SHIM_PREFIX,
            suffix=".so",
            variants=[(CFLAGS, LIBS)],
            env=env,
            timeout_s=timeout_s,
        )
    except BuildFailed as e:
        raise ShimUnavailable(str(e)) from e


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
