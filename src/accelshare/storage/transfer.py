"""Streaming a file (a byte range of it) or a directory as a zip, in constant memory.

Both are synchronous iterators of chunks; Starlette's ``StreamingResponse`` runs each
step in a worker thread.  The zip is written with :mod:`zipfile` to a sink that hands
out what it holds after each chunk (entries are stored, not compressed, so the stream
keeps up with the disk; ZIP64 for big files).  Symbolic links are skipped, never
followed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import zipfile
from collections.abc import Iterator

__all__ = ["CHUNK", "iter_file", "iter_zip"]

CHUNK = 1024 * 1024


def iter_file(fd: int, start: int, length: int) -> Iterator[bytes]:
    """``length`` bytes from ``start``; closes ``fd`` at the end (or when abandoned)."""
    try:
        offset, end = start, start + length
        while offset < end:
            data = os.pread(fd, min(CHUNK, end - offset), offset)
            if not data:
                break  # the file shrank meanwhile
            offset += len(data)
            yield data
    finally:
        os.close(fd)


class _Sink:
    """A write-only stream that keeps bytes until they are taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def iter_zip(dir_fd: int) -> Iterator[bytes]:
    """The tree under ``dir_fd`` as a zip; closes ``dir_fd`` at the end."""
    sink = _Sink()
    try:
        with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED) as archive:
            yield from _add_tree(archive, sink, dir_fd, "")
        yield sink.take()
    finally:
        os.close(dir_fd)


def _add_tree(archive: zipfile.ZipFile, sink: _Sink, dir_fd: int, prefix: str) -> Iterator[bytes]:
    with os.scandir(dir_fd) as it:
        names = sorted(entry.name for entry in it)
    if not names and prefix:
        archive.writestr(zipfile.ZipInfo(prefix), b"")  # an empty directory: "name/"
    for name in names:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                yield from _add_tree(archive, sink, sub, f"{prefix}{name}/")
            finally:
                os.close(sub)
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue
            with contextlib.closing(os.fdopen(fd, "rb")) as source:
                entry = zipfile.ZipInfo.from_file(f"/proc/self/fd/{fd}", f"{prefix}{name}")
                entry.file_size = os.fstat(fd).st_size
                with archive.open(entry, "w", force_zip64=entry.file_size > 2**31) as dest:
                    while data := source.read(CHUNK):
                        dest.write(data)
                        yield sink.take()
            yield sink.take()
