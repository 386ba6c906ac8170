"""Paths inside a folder, checked and walked without ever following a link out of it.

A path from a client is a relative POSIX path (``data/train.csv``).  :func:`split_relpath`
refuses, before any file-system access, NUL, absolute paths, ``..`` components and
over-long names (``bad-path``).  :func:`walk` then goes down from the folder's directory
one component at a time with ``openat(..., O_NOFOLLOW | O_DIRECTORY)``, so the kernel
never follows a symbolic link for us: a link met on the way is read (``readlinkat``) and
resolved *lexically* against the real directories walked so far.  A link whose target
is absolute, or whose ``..`` climbs above the folder, is refused (``bad-path``); a link
that stays inside is followed.  A component swapped for a link between the check and
the open makes the ``O_NOFOLLOW`` open fail (``ELOOP``), which is also ``bad-path``, so
there is no time-of-check/time-of-use window.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from accelshare.protocol.storage import StorageErrorType

from .errors import StorageError

__all__ = ["MAX_LINKS", "MAX_NAME_BYTES", "close_quietly", "open_dir", "split_relpath", "walk"]

MAX_NAME_BYTES = 255
MAX_LINKS = 40  # symbolic links followed in one walk (the kernel's own limit)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _bad(field: str, why: str, value: str) -> StorageError:
    return StorageError(
        StorageErrorType.BAD_PATH,
        f"{field}: expected a relative POSIX path inside the folder ({why}), received {value!r}",
    )


def split_relpath(path: str, *, field: str = "path", allow_root: bool = True) -> tuple[str, ...]:
    """The components of ``path`` (``""`` and ``"."`` are the folder itself: ``()``)."""
    if "\x00" in path:
        raise _bad(field, "no NUL character", path)
    if path.startswith("/"):
        raise _bad(field, "not an absolute path", path)
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _bad(field, "no '..' component", path)
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise _bad(field, f"names of at most {MAX_NAME_BYTES} bytes", path)
    if not parts and not allow_root:
        raise _bad(field, "a file or directory, not the folder itself", path)
    return parts


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def open_dir(name: str, dir_fd: int, *, field: str, shown: str) -> int:
    """``openat(dir_fd, name, O_DIRECTORY | O_NOFOLLOW)``, errors as refusals."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise StorageError(
            StorageErrorType.NO_FILE, f"{field}: no such directory in the folder: {shown!r}"
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _bad(field, "no symbolic link leaving the folder", shown) from None
        if e.errno == errno.ENOTDIR:
            raise StorageError(
                StorageErrorType.BAD_REQUEST, f"{field}: expected a directory, received {shown!r}"
            ) from None
        raise


def walk(
    root_fd: int,
    parts: tuple[str, ...],
    *,
    follow_last: bool,
    create_dirs: bool = False,
    field: str = "path",
    shown: str = "",
) -> tuple[int, str | None]:
    """Go down ``parts`` from the folder's directory ``root_fd``.

    Returns ``(dir_fd, name)``: an open descriptor of the real directory holding the
    last component and that component's name, which may not exist; ``name`` is None when
    the path is a directory itself (then ``dir_fd`` is it).  The caller closes
    ``dir_fd``.  ``follow_last``: a link as last component is resolved too (reads);
    otherwise it is returned as it is (deletes, moves, the target of an upload).
    ``create_dirs``: missing directories on the way are created (uploads).
    """
    fds = [os.dup(root_fd)]
    todo = list(parts)
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":  # only from a link's target
                if len(fds) == 1:
                    raise _bad(field, "no symbolic link leaving the folder", shown)
                os.close(fds.pop())
                continue
            last = not todo
            if last and not follow_last:
                return fds.pop(), name
            try:
                info = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return fds.pop(), name
                if not create_dirs:
                    raise StorageError(
                        StorageErrorType.NO_FILE,
                        f"{field}: no such directory in the folder: {shown!r}",
                    ) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fds[-1])
                todo.insert(0, name)
                continue
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise _bad(field, f"at most {MAX_LINKS} symbolic links", shown)
                target = os.readlink(name, dir_fd=fds[-1])
                if target.startswith("/"):
                    raise _bad(field, "no symbolic link leaving the folder", shown)
                todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if last:
                return fds.pop(), name
            if not stat.S_ISDIR(info.st_mode):
                raise StorageError(
                    StorageErrorType.NO_FILE,
                    f"{field}: {name!r} on the way is not a directory: {shown!r}",
                )
            fds.append(open_dir(name, fds[-1], field=field, shown=shown))
        return fds.pop(), None
    finally:
        for fd in fds:
            close_quietly(fd)
