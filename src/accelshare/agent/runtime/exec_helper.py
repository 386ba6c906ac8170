"""The kernels' exec helper: a small C program that starts a kernel's command.

``exec_helper/accelshare_exec.c`` (shipped with the package) is compiled by the agent at
start (:mod:`accelshare.cbuild`: ``cc``, or ``$CC``; statically where the C library
allows, else dynamically) into ``<scratch root>/.exec-helper/accelshare-exec-<hash>``,
the hash of the source and the flags: an agent rebuilds it only when they change.  The
folder and the file are the agent's (root's), mode 0755: kernels may run it, never
change it.  Its modes (the C source says exactly what each does):

* ``enter``: the kernel's process.  The supervisor (``_launcher.py``) starts it with
  ``posix_spawn`` (no copy of the interpreter's pages, no Python run in the kernel's
  process) instead of forking a Python child: it joins the kernel's cgroups, sets its
  rlimits and CPU affinity, its stdin, log and cwd, and execs the command (or bwrap).
  It gets an empty environment of its own: the kernel's comes through a pipe.
* ``supervise``: the kernel's supervisor, started by the launcher's fork server with
  ``posix_spawn`` when the launch record names the helper
  (``_launcher.spawn_supervisor``): what ``_launcher.supervise`` does, in C, its kernel's
  process a fork of its own that goes on as ``enter``.  It gets a fixed environment
  (``PATH`` only) and everything else as arguments and descriptors.
* ``drop``: inside a sandbox started by a root agent, the change to the kernel's user
  (:func:`.sandbox._command_prefix`): the same end state as ``setpriv --reuid
  --regid --clear-groups --inh-caps=-all --bounding-set=-all``, without setpriv's
  dynamic linking and libcap-ng.  It runs with bwrap's fixed environment and reads the
  kernel's from a descriptor, applied only after the change of user: a dynamic build
  loads nothing a session names either.  The sandbox binds the file read-only at its
  own path.
* ``env``: the kernel's environment from a descriptor, then the command, with no change
  of user (a sandbox of an agent that is not root; a terminal, after nsenter).

No compiler, or a failed build: the agent logs one line and kernels start the Python
way (a forked child, setpriv); the process runtime says which at start (``kernel exec``
in its log line and :attr:`ExecHelperState.status`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accelshare.cbuild import BuildFailed, build

__all__ = [
    "HELPER_DIR",
    "HELPER_PREFIX",
    "HELPER_SOURCE",
    "VARIANTS",
    "ExecHelperState",
    "build_exec_helper",
    "prepare_exec_helper",
]

log = logging.getLogger(__name__)

HELPER_SOURCE = Path(__file__).parent / "exec_helper" / "accelshare_exec.c"
HELPER_PREFIX = "accelshare-exec-"
#: Under the scratch root (a name no kernel id can have).
HELPER_DIR = ".exec-helper"
_WARNINGS = ("-O2", "-Wall")
#: Static first (no dynamic loader, no library search: the cheapest exec, and nothing of
#: a kernel's environment can reach it); dynamic where there is no static C library.
VARIANTS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("-static", *_WARNINGS), ()),
    (_WARNINGS, ()),
)


@dataclass(frozen=True, slots=True)
class ExecHelperState:
    """The agent's exec helper (None: kernels start the Python way) or why not."""

    path: Path | None = None
    reason: str = ""

    @property
    def status(self) -> str:
        """One line: which way kernels start."""
        if self.path is not None:
            return f"exec helper {self.path}"
        return f"python fork and setpriv (no exec helper: {self.reason})"


def build_exec_helper(
    folder: Path, *, source: Path = HELPER_SOURCE, env: Mapping[str, str] | None = None
) -> Path:
    """The helper in ``folder``, compiled unless a build of the same source is there
    (I/O, blocking); :class:`~accelshare.cbuild.BuildFailed` naming why it cannot be."""
    return build(source, folder, prefix=HELPER_PREFIX, variants=VARIANTS, env=env)


def prepare_exec_helper(
    scratch_root: Path, *, env: Mapping[str, str] | None = None
) -> ExecHelperState:
    """:func:`build_exec_helper` into ``<scratch_root>/.exec-helper``, logged: never
    raises :class:`~accelshare.cbuild.BuildFailed`."""
    try:
        path = build_exec_helper(scratch_root / HELPER_DIR, env=env)
    except BuildFailed as e:
        log.warning(
            "kernel exec: the exec helper was not built (%s); kernels start through a"
            " forked Python process and setpriv (slower)",
            e,
        )
        return ExecHelperState(reason=str(e))
    log.info("kernel exec: exec helper ready: %s", path)
    return ExecHelperState(path=path)
