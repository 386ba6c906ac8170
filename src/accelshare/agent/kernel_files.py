"""A running kernel's working folder, read and written by the agent on the host
(``session upload`` / ``download`` / ``ls``; routes in :mod:`accelshare.protocol.files`).

The working folder is the kernel's scratch ``work/`` (``/home/work`` in docker, ``HOME``
in the process runtime).  A storage folder mounted under ``/home/work/<x>`` (the
``MOUNTS`` line of the kernel's ``resource.txt``) is reached at its host folder: a path
under ``<x>`` lands in the folder itself, as the kernel would see it, and a read-only
one cannot be written (409).

Safety: a path is relative, without ``..`` or control characters
(:func:`~accelshare.protocol.files.check_relative_path`); every part of it is opened
with ``O_NOFOLLOW`` from the folder above it (``openat``), so a symlink the kernel made
(``work/escape -> /etc``) is never followed out: a symlink on the way is refused, a
symlink as the last part is listed and archived as a link, never read through.

Uploads stream to a hidden temporary file next to the target
(``.<name>.upload-<random>``), renamed over the name only once whole: a reader never
sees half a file, and an upload over ``[container] file-upload-max-bytes`` or cut short
leaves nothing.  New files and folders belong to the kernel's user (the agent, as root,
gives them over).  Downloads are ``tar`` streams made as they are read (constant memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import queue
import secrets
import stat
import tarfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from accelshare.protocol.files import WORK_HOME, FileEntry, FileList, FileUploadResult

__all__ = [
    "FileConflict",
    "FileMissing",
    "KernelFolder",
    "UploadTooLarge",
    "list_folder",
    "put_file",
    "read_mounts",
    "tar_stream",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 256 * 1024


class FileMissing(LookupError):
    """No such file or folder (404)."""


class FileConflict(Exception):
    """The path exists as the wrong kind, crosses a symlink, or is read-only (409)."""


class UploadTooLarge(Exception):
    """An upload over the limit (413): nothing was kept."""

    def __init__(self, limit_bytes: int, received_bytes: int) -> None:
        super().__init__(
            f"the file is too large: the limit is {limit_bytes} bytes ([container]"
            f" file-upload-max-bytes), received at least {received_bytes}"
        )
        self.limit_bytes = limit_bytes
        self.received_bytes = received_bytes


@dataclass(frozen=True, slots=True)
class KernelFolder:
    """One kernel's working folder on the host.  ``mounts``: work-relative path ->
    (host folder, read-only) for the storage folders under /home/work; ``owner``: the
    kernel's uid/gid for what the agent creates (None: leave the agent's)."""

    work_dir: Path
    mounts: dict[str, tuple[Path, bool]]
    owner: tuple[int, int] | None = None

    def locate(self, rel: str) -> tuple[Path, list[str], bool]:
        """(the folder the path starts from, the parts below it, read-only)."""
        for inside, (host, read_only) in self.mounts.items():
            if rel == inside or rel.startswith(inside + "/"):
                rest = rel[len(inside) :].strip("/")
                return host, [p for p in rest.split("/") if p], read_only
        return self.work_dir, [p for p in rel.split("/") if p], False


def read_mounts(resource_txt: str) -> dict[str, tuple[Path, bool]]:
    """The storage folders under /home/work from a ``resource.txt``'s ``MOUNTS`` line
    (work-relative path -> (host folder, read-only))."""
    found: dict[str, tuple[Path, bool]] = {}
    for line in resource_txt.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.strip() != "MOUNTS" or not value.strip():
            continue
        for item in value.strip().split(","):
            parts = item.rsplit(":", 2)
            if len(parts) != 3:
                continue
            source, target, perm = parts
            if target.startswith(WORK_HOME + "/"):
                found[target[len(WORK_HOME) + 1 :].strip("/")] = (Path(source), perm == "ro")
    return found


def _open_dirs(base: Path, parts: list[str], *, create: bool, owner: tuple[int, int] | None) -> int:
    """A descriptor of ``base/parts...``, every part opened with O_NOFOLLOW from the one
    above (``create``: missing folders made, as the kernel's user)."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise FileMissing(f"{part!r}: no such folder") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None and os.geteuid() == 0:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise FileConflict(f"{part!r} is a symlink: not followed") from None
                raise FileConflict(f"{part!r} is not a folder") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- upload -----------------------------------------------------------------------------


async def put_file(
    folder: KernelFolder, rel: str, chunks: AsyncIterator[bytes], *, limit_bytes: int
) -> FileUploadResult:
    """Write the streamed ``chunks`` to ``rel`` (replacing a file there) once whole."""
    base, parts, read_only = folder.locate(rel)
    if not parts:
        raise FileConflict(f"{rel or '.'!r} is a folder: name a file")
    if read_only:
        raise FileConflict(f"{rel!r} lies in a read-only mount")
    name = parts[-1]
    dir_fd = await asyncio.to_thread(_open_dirs, base, parts[:-1], create=True, owner=folder.owner)
    tmp = f".{name}.upload-{secrets.token_hex(6)}"
    size = 0
    kept = False
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dir_fd,
        )
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit_bytes:
                    raise UploadTooLarge(limit_bytes, size)
                await asyncio.to_thread(_write_all, fd, chunk)
            if folder.owner is not None and os.geteuid() == 0:
                os.fchown(fd, *folder.owner)
        finally:
            os.close(fd)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                raise FileConflict(f"{rel!r} is a folder")
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        kept = True
    finally:
        if not kept:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)
    return FileUploadResult(path=rel, size=size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# -- list -------------------------------------------------------------------------------


def list_folder(folder: KernelFolder, rel: str) -> FileList:
    """The entries of the folder ``rel`` (symlinks as links, never followed)."""
    base, parts, _ = folder.locate(rel)
    fd = _open_dirs(base, parts, create=False, owner=None)
    try:
        names = sorted(os.listdir(fd))
        entries = []
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # gone meanwhile
                continue
            entries.append(
                FileEntry(
                    filename=name,
                    size=st.st_size,
                    mode=stat.filemode(st.st_mode),
                    mtime=st.st_mtime,
                    ctime=st.st_ctime,
                    atime=st.st_atime,
                )
            )
    finally:
        os.close(fd)
    return FileList(path=rel, files=entries)


# -- download ---------------------------------------------------------------------------


def _check_target(folder: KernelFolder, rel: str) -> None:
    """``FileMissing`` / ``FileConflict`` before a download's answer starts."""
    base, parts, _ = folder.locate(rel)
    fd = _open_dirs(base, parts[:-1], create=False, owner=None)
    try:
        if parts:
            try:
                os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileMissing(f"{rel!r}: no such file or folder") from None
    finally:
        os.close(fd)


class _QueueWriter:
    """A file object for ``tarfile`` that hands its bytes to the event loop in chunks
    (at most a few buffered: the reader's pace sets the writer's)."""

    def __init__(self, out: queue.Queue[bytes | BaseException | None]) -> None:
        self._out = out
        self._buffer = bytearray()
        self.closed_by_reader = threading.Event()

    def write(self, data: bytes) -> int:
        if self.closed_by_reader.is_set():
            raise BrokenPipeError("the download was abandoned")
        self._buffer += data
        if len(self._buffer) >= _CHUNK:
            self._out.put(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def flush_rest(self) -> None:
        if self._buffer:
            self._out.put(bytes(self._buffer))
            self._buffer.clear()


def _archive(folder: KernelFolder, rel: str, writer: _QueueWriter) -> None:
    base, parts, _ = folder.locate(rel)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        if parts:
            fd = _open_dirs(base, parts[:-1], create=False, owner=None)
            try:
                _add(tar, folder, fd, parts[-1], parts[-1], rel)
            finally:
                os.close(fd)
        else:  # the whole folder (or a whole mount)
            arcname = Path(rel).name if rel else Path(WORK_HOME).name
            fd = os.open(base, _DIR_FLAGS)
            try:
                _add_dir(tar, folder, fd, arcname, rel)
            finally:
                os.close(fd)
    writer.flush_rest()


def _add(
    tar: tarfile.TarFile, folder: KernelFolder, dir_fd: int, name: str, arc: str, rel: str
) -> None:
    if rel in folder.mounts:  # a storage folder's mount point: the folder itself
        fd = os.open(folder.mounts[rel][0], _DIR_FLAGS)
        try:
            _add_dir(tar, folder, fd, arc, rel)
        finally:
            os.close(fd)
        return
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    info = tarfile.TarInfo(arc)
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            _add_dir(tar, folder, fd, arc, rel)
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as source:
            info.size = os.fstat(source.fileno()).st_size
            tar.addfile(info, source)
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
        tar.addfile(info)
    # sockets, fifos, devices: left out


def _add_dir(tar: tarfile.TarFile, folder: KernelFolder, fd: int, arc: str, rel: str) -> None:
    st = os.fstat(fd)
    info = tarfile.TarInfo(arc)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    tar.addfile(info)
    for child in sorted(os.listdir(fd)):
        _add(tar, folder, fd, child, f"{arc}/{child}", f"{rel}/{child}" if rel else child)


async def tar_stream(folder: KernelFolder, rel: str) -> AsyncIterator[bytes]:
    """A tar archive of the file or folder ``rel``, made as it is read; checks the path
    first (``FileMissing``, ``FileConflict`` before the first byte)."""
    await asyncio.to_thread(_check_target, folder, rel)
    return _stream(folder, rel)


async def _stream(folder: KernelFolder, rel: str) -> AsyncIterator[bytes]:
    out: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=8)
    writer = _QueueWriter(out)

    def produce() -> None:
        try:
            _archive(folder, rel, writer)
            out.put(None)
        except BaseException as e:  # handed to the reader
            if not writer.closed_by_reader.is_set():
                out.put(e)

    thread = threading.Thread(target=produce, name="kernel-files-tar", daemon=True)
    thread.start()
    try:
        while True:
            item = await asyncio.to_thread(out.get)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        writer.closed_by_reader.set()
        with contextlib.suppress(queue.Empty):
            while True:  # unblock a writer waiting on a full queue
                out.get_nowait()
