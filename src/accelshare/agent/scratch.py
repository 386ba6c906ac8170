"""Per-kernel scratch directories: the kernel's files on the agent's disk.

Layout (``<scratch-root>/<kernel_id>/``)::

    config/resource.txt    what the kernel asked for and holds (spec 04); the docker
                           runtime mounts config/ at /home/config
    config/...             the plugins' files (e.g. bin/nvidia-smi for mock CUDA devices)
    work/                  the kernel's working directory (/home/work in docker)
    logs/kernel.log        stdout + stderr of the kernel (docker: saved at destroy)
    state/launch.json      how the process runtime started it (argv, env, cgroups)
    state/proc.json        supervisor and kernel pid + start time (written by the launcher)
    state/exit.json        how it ended (written by the launcher or the runtime)
    state/agent.json       the agent's record of the kernel (docker runtime; the process
                           runtime keeps it in launch.json, see state_files)

The directory outlives the kernel and the agent: after a restart it is how kernels are
found again (see :mod:`accelshare.agent.recovery`).  A file in a directory that
:meth:`ScratchDir.prepare` has just made is written in place (``new=True``: created with
``O_EXCL``, one write): nobody reads it before the kernel starts, and an agent that dies
while writing it leaves a kernel that never started (recovery reports it failed, see
:mod:`accelshare.agent.runtime.process_state`).  Every file written later is replaced
atomically (write to a temporary name, rename), so an agent crash never leaves a
half-written file behind; ``CID=`` is appended to ``resource.txt`` in one ``write`` (a
reader sees the file without or with the whole line).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .resource_txt import with_container_id

if TYPE_CHECKING:  # runtime/ imports this module
    from .runtime.base import ConfigFileLike

__all__ = [
    "KERNEL_ID_PATTERN",
    "ScratchDir",
    "atomic_write_text",
    "is_valid_kernel_id",
    "list_kernel_ids",
    "read_json",
    "write_new_text",
]

KERNEL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""Kernel ids become directory, cgroup and container names: keep them path-safe."""


def is_valid_kernel_id(kernel_id: str) -> bool:
    return bool(KERNEL_ID_PATTERN.match(kernel_id))


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644, durable: bool = False) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half.

    Written to a temporary file in the same directory, then renamed over.  No fsync by
    default: these files must survive an *agent* crash (the page cache does), while a
    host crash ends every kernel anyway; ``durable=True`` fsyncs for other uses.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            _write_all(fd, text.encode())
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def write_new_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Create ``path`` (``FileExistsError`` if it exists) holding ``text``, in one write.

    For files nobody can read yet (in a directory just made): no temporary file, no
    rename.  A failed write removes the file again.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # (the umask may have taken bits the mode asks for)
            _write_all(fd, text.encode())
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_bytes(path: Path) -> bytes:
    """The whole file (no buffered text layer: one open, reads, one close)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when missing, unreadable or not an object."""
    try:
        data = json.loads(_read_bytes(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def list_kernel_ids(scratch_root: Path) -> list[str]:
    """Kernel ids that have a scratch dir under ``scratch_root`` (sorted).

    Entries that are not directories or whose name is not a valid kernel id (editor
    backups, ``lost+found``...) are ignored.
    """
    try:
        entries = list(os.scandir(scratch_root))
    except FileNotFoundError:
        return []
    return sorted(
        entry.name
        for entry in entries
        if is_valid_kernel_id(entry.name) and entry.is_dir(follow_symlinks=False)
    )


class ScratchDir:
    """Paths of one kernel's scratch directory (nothing is created until :meth:`prepare`)."""

    __slots__ = ("kernel_id", "root")

    def __init__(self, scratch_root: Path, kernel_id: str) -> None:
        if not is_valid_kernel_id(kernel_id):
            raise ValueError(
                f"Invalid kernel id {kernel_id!r}: expected letters, digits, '_', '.', '-' "
                "(at most 128, starting with a letter or digit)"
            )
        self.kernel_id = kernel_id
        self.root = Path(scratch_root).absolute() / kernel_id

    def __repr__(self) -> str:
        return f"ScratchDir({str(self.root)!r})"

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def resource_txt(self) -> Path:
        return self.config_dir / "resource.txt"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def log_file(self) -> Path:
        return self.log_dir / "kernel.log"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def launch_file(self) -> Path:
        return self.state_dir / "launch.json"

    @property
    def proc_file(self) -> Path:
        return self.state_dir / "proc.json"

    @property
    def exit_file(self) -> Path:
        return self.state_dir / "exit.json"

    @property
    def meta_file(self) -> Path:
        return self.state_dir / "agent.json"

    def exists(self) -> bool:
        return os.path.isdir(self.root)

    def prepare(self) -> bool:
        """Create the directory tree (idempotent); True when this call made the kernel's
        directory (then its files are new: write them with ``new=True``)."""
        subdirs = (self.config_dir, self.work_dir, self.log_dir, self.state_dir)
        try:
            try:
                os.mkdir(self.root)
            except FileNotFoundError:  # no scratch root yet
                self.root.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(self.root)
        except FileExistsError:
            for directory in subdirs:
                directory.mkdir(parents=True, exist_ok=True)
            return False
        for directory in subdirs:
            os.mkdir(directory)
        return True

    def write_resource_txt(self, text: str, *, new: bool = False) -> None:
        """Write ``config/resource.txt``: atomically replaced, or with ``new`` created
        (see :meth:`prepare`)."""
        if new:
            write_new_text(self.resource_txt, text)
        else:
            atomic_write_text(self.resource_txt, text)

    def add_container_id(self, written: str, container_id: str) -> None:
        """Add ``CID=<container_id>`` to the ``resource.txt`` this agent wrote as
        ``written``: appended in one write while the file is still ``written``, else (the
        kernel changed it, an old file) the file read back, updated and replaced."""
        updated = with_container_id(written, container_id)
        if updated == written:
            return
        if updated.startswith(written):
            expected = len(written.encode())
            fd = os.open(self.resource_txt, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size == expected:
                    tail = updated[len(written) :].encode()
                    if os.write(fd, tail) == len(tail):
                        return
            finally:
                os.close(fd)
        # (a short append leaves a partial line: the replace below completes it)
        text = self.read_resource_txt()
        replaced = with_container_id(text, container_id)
        if replaced != text:
            atomic_write_text(self.resource_txt, replaced)

    def write_config_files(self, files: Iterable[ConfigFileLike], *, new: bool = False) -> None:
        """Write the plugins' files under ``config/`` (executables get mode 0755); with
        ``new``, into the config dir :meth:`prepare` has just made.

        Paths were validated by :class:`~accelshare.accel.types.ConfigFile`; one that
        still leaves the config dir is a ValueError (never written).
        """
        files = tuple(files)
        if not files:
            return
        # A config dir just made has no symlinks in it: the normalized path is the file.
        root = Path(os.path.normpath(self.config_dir)) if new else self.config_dir.resolve()
        for file in files:
            joined = self.config_dir / file.path
            target = Path(os.path.normpath(joined)) if new else joined.resolve()
            if root not in target.parents:
                raise ValueError(f"config file {file.path!r} leaves the config dir {root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = 0o755 if file.executable else 0o644
            if new:
                write_new_text(target, file.text, mode=mode)
            else:
                atomic_write_text(target, file.text, mode=mode)

    def read_resource_txt(self) -> str:
        return self.resource_txt.read_text(encoding="utf-8")

    def write_json(self, path: Path, data: dict[str, Any], *, new: bool = False) -> None:
        """Write ``data`` as JSON: atomically replaced, or with ``new`` created (a file in
        a directory :meth:`prepare` has just made)."""
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        if new:
            write_new_text(path, text)
        else:
            atomic_write_text(path, text)

    def read_log_tail(self, tail_bytes: int | None = None) -> str:
        """The end of ``logs/kernel.log`` (all of it when ``tail_bytes`` is None); "" if none."""
        try:
            with self.log_file.open("rb") as log:
                if tail_bytes is not None:
                    size = log.seek(0, os.SEEK_END)
                    log.seek(max(0, size - tail_bytes))
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def remove(self) -> None:
        """Delete the whole directory (missing is fine)."""
        shutil.rmtree(self.root, ignore_errors=True)
