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

The directory outlives the kernel and the agent: after a restart it is how kernels are
found again (see :mod:`accelshare.agent.recovery`).  Every file here is replaced
atomically (write to a temporary name, rename), so an agent crash never leaves a
half-written ``resource.txt`` behind.
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

if TYPE_CHECKING:  # runtime/ imports this module
    from .runtime.base import ConfigFileLike

__all__ = [
    "KERNEL_ID_PATTERN",
    "ScratchDir",
    "atomic_write_text",
    "is_valid_kernel_id",
    "list_kernel_ids",
    "read_json",
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
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            if durable:
                tmp.flush()
                os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
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

    def exists(self) -> bool:
        return self.root.is_dir()

    def prepare(self) -> None:
        """Create the directory tree (idempotent)."""
        for directory in (self.config_dir, self.work_dir, self.log_dir, self.state_dir):
            directory.mkdir(parents=True, exist_ok=True)

    def write_resource_txt(self, text: str) -> None:
        atomic_write_text(self.resource_txt, text)

    def write_config_files(self, files: Iterable[ConfigFileLike]) -> None:
        """Write the plugins' files under ``config/`` (executables get mode 0755).

        Paths were validated by :class:`~accelshare.accel.types.ConfigFile`; one that
        still leaves the config dir is a ValueError (never written).
        """
        root = self.config_dir.resolve()
        for file in files:
            target = (self.config_dir / file.path).resolve()
            if root not in target.parents:
                raise ValueError(f"config file {file.path!r} leaves the config dir {root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, file.text, mode=0o755 if file.executable else 0o644)

    def read_resource_txt(self) -> str:
        return self.resource_txt.read_text(encoding="utf-8")

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")

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
