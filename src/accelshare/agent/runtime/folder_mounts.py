"""Storage folders bound into kernels (``CreateKernelRequest.mounts``), for both runtimes.

A folder mount names a folder on the agent's host (``host_path``: a storage volume that
every agent mounts at the same path) and where the kernel sees it (``kernel_path``)::

    kernel_path "/home/work/data"   docker: /home/work/data in the container;
                                    process: <scratch>/work/data (the kernel's work
                                    folder and HOME stand for /home/work there)
    kernel_path "data"              the same as /home/work/data (Backend.AI's form)
    kernel_path "/datasets/imagenet" that path as it is (docker, sandboxed process)

What is refused, each with a reason naming the mount (the kernel ends FAILED):

* a ``kernel_path`` with ``..``, NUL, ``,`` or ``:``, ``/home/work`` itself, or one
  covering the system folders or the runtime's own binds (:func:`check_target`);
* a ``host_path`` that is missing, not absolute, or not a directory
  (:func:`check_host_folder`).

Ownership: every kernel runs as the agent's ``[container] kernel-uid`` /
``kernel-gid``.  An agent running as root gives the folder's entries that belong to
another user to the kernel's user before the start (:func:`give_to_kernel_user`: one
walk of the folder, entries already owned are left untouched), so that a kernel can
read and (``rw``) write every file.  An agent that is not root cannot change owners:
its kernels run as the agent's own uid, and files of other users show there as they
are on the host (inside a sandbox's user namespace: owned by ``nobody``, 65534), with
their host permission bits deciding access.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "WORK_HOME",
    "FolderMount",
    "MountRefused",
    "check_host_folder",
    "check_target",
    "give_to_kernel_user",
    "normalize_kernel_path",
]

#: Where a kernel's working folder is (docker: the container path; the process runtime
#: maps it onto the scratch dir's work/).
WORK_HOME = "/home/work"

#: Kernel paths that no folder may cover or lie under (the system, the runtime's own).
_RESERVED = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
    "/home/config",
)
#: Kernel paths a folder may lie under but not replace.
_NOT_ITSELF = ("/", "/home", WORK_HOME, "/tmp", "/run", "/var", "/opt", "/mnt", "/srv")


class MountRefused(ValueError):
    """A folder mount that cannot be made (the message names the mount)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"mount {name!r}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FolderMount:
    """One storage folder for a kernel: ``kernel_path`` is absolute and normal
    (:func:`normalize_kernel_path`)."""

    name: str
    host_path: str
    kernel_path: str
    read_only: bool = False

    @property
    def perm(self) -> str:
        return "ro" if self.read_only else "rw"

    def work_relative(self) -> str | None:
        """The path under ``/home/work`` (``"data"``), None when the mount lies elsewhere."""
        if self.kernel_path.startswith(WORK_HOME + "/"):
            return self.kernel_path[len(WORK_HOME) + 1 :]
        return None


def normalize_kernel_path(name: str, kernel_path: str) -> str:
    """``kernel_path`` as an absolute, normal path (a relative one lies under
    ``/home/work``); ``MountRefused`` for one the kernel must not get."""
    if "\x00" in kernel_path:
        raise MountRefused(name, "kernel_path contains a NUL character")
    for char in (",", ":"):
        if char in kernel_path:
            raise MountRefused(name, f"kernel_path {kernel_path!r} contains {char!r}")
    if ".." in kernel_path.split("/"):
        raise MountRefused(name, f"kernel_path {kernel_path!r} contains '..'")
    if not kernel_path.startswith("/"):
        kernel_path = f"{WORK_HOME}/{kernel_path}"
    path = posixpath.normpath(kernel_path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    check_target(name, path)
    return path


def check_target(name: str, path: str, others: Iterable[str] = ()) -> None:
    """Refuse a kernel path that is a reserved folder, lies under one of the system's,
    or covers / lies under one of ``others`` (the runtime's own binds: given as paths
    inside the kernel)."""
    if path in _NOT_ITSELF:
        raise MountRefused(name, f"kernel_path {path!r} would cover a system folder")
    for reserved in _RESERVED:
        if path == reserved or path.startswith(reserved + "/"):
            raise MountRefused(
                name, f"kernel_path {path!r} would cover the system folder {reserved}"
            )
    for given in others:
        other = posixpath.normpath(given)
        if path == other or other.startswith(path.rstrip("/") + "/"):
            raise MountRefused(name, f"kernel_path {path!r} would cover the kernel's {other}")
        if path.startswith(other.rstrip("/") + "/"):
            raise MountRefused(name, f"kernel_path {path!r} lies inside the kernel's {other}")


def check_host_folder(mount: FolderMount) -> Path:
    """The host folder, resolved; ``MountRefused`` when it is not an existing directory."""
    if "\x00" in mount.host_path or "," in mount.host_path:
        raise MountRefused(mount.name, f"host_path {mount.host_path!r} contains NUL or ','")
    path = Path(mount.host_path)
    if not path.is_absolute():
        raise MountRefused(mount.name, f"host_path {mount.host_path!r} is not absolute")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountRefused(mount.name, f"host_path {mount.host_path} does not exist") from None
    except OSError as e:
        raise MountRefused(mount.name, f"host_path {mount.host_path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountRefused(mount.name, f"host_path {mount.host_path} is not a directory")
    return path.resolve()


def give_to_kernel_user(folder: Path, uid: int, gid: int) -> int:
    """Give the folder and everything in it that belongs to someone else to ``uid:gid``
    (symlinks themselves, never what they point to); only as root (else nothing
    happens).  Returns how many entries changed owner."""
    if os.geteuid() != 0:
        return 0
    changed = 0

    def fix(path: str) -> None:
        nonlocal changed
        st = os.lstat(path)
        if st.st_uid != uid or st.st_gid != gid:
            os.lchown(path, uid, gid)
            changed += 1

    fix(str(folder))
    for top, dirs, files in os.walk(folder, followlinks=False):
        for entry in (*dirs, *files):
            fix(os.path.join(top, entry))
    return changed
