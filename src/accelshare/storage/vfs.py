"""The ``vfs`` backend: folders as directories on one file system (docs/storage.md).

Layout of a volume's directory::

    <path>/<id[0:2]>/<id[2:4]>/<id>/      a folder (its files, as users see them)
    <path>/.accelshare/quota/<id>         a folder's quota in bytes (absent: no limit)
    <path>/.accelshare/uploads/<s>.json   an upload session (folder, path, size, expiry)
    <path>/.accelshare/uploads/<s>.part   its bytes so far; renamed into the folder when whole

Upload state lives outside the folders (a session that mounts a folder never sees it),
on the same file system, so that the last step of an upload is one atomic ``rename``.

Quotas: this backend has no file-system project quotas, so it does not report the
``quota`` capability; the proxy enforces a folder's quota when an upload is requested
(its declared size + the folder's usage from a scan + the sizes of the folder's other
open uploads must fit).

Every method is synchronous and blocking; the apps run them in worker threads.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from accelshare.protocol.storage import (
    FileEntry,
    FileListPage,
    FolderUsage,
    StorageErrorType,
    VolumeInfo,
)

from .errors import StorageError
from .paths import DIR_FLAGS, close_quietly, open_dir, split_relpath, walk

__all__ = ["OpenDir", "OpenFile", "UploadSession", "Volume"]

STATE_DIR = ".accelshare"
_LISTING_CACHE = 16  # directories whose sorted names are kept
_RACY_S = 2.0  # a directory changed this recently is never served from the cache


class UploadSession(BaseModel):
    model_config = ConfigDict(frozen=True)

    session: str
    folder_id: str
    path: str
    size: int
    expires: float
    done: bool = False


@dataclass(frozen=True, slots=True)
class OpenDir:
    fd: int
    name: str


@dataclass(frozen=True, slots=True)
class OpenFile:
    fd: int
    name: str
    size: int
    mtime: float


class Volume:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.state = path / STATE_DIR
        self.uploads = self.state / "uploads"
        self.quotas = self.state / "quota"
        self._names: OrderedDict[tuple[int, int, int, int], list[str]] = OrderedDict()
        self._names_lock = threading.Lock()

    def prepare(self) -> None:
        if not self.path.is_dir():
            raise OSError(f"volume {self.name}: {self.path} is not a directory")
        self.uploads.mkdir(parents=True, exist_ok=True)
        self.quotas.mkdir(parents=True, exist_ok=True)

    # -- volumes and folders ---------------------------------------------------------------
    def info(self) -> VolumeInfo:
        fs = os.statvfs(self.path)
        total = fs.f_blocks * fs.f_frsize
        return VolumeInfo(
            name=self.name,
            path=str(self.path),
            capabilities=[],
            total_bytes=total,
            used_bytes=total - fs.f_bfree * fs.f_frsize,
        )

    def folder_path(self, folder_id: str) -> Path:
        return self.path / folder_id[0:2] / folder_id[2:4] / folder_id

    def _root_fd(self, folder_id: str) -> int:
        try:
            return os.open(self.folder_path(folder_id), DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            raise StorageError(
                StorageErrorType.NO_FOLDER,
                f"folder_id: expected a folder on volume {self.name!r}, received {folder_id!r}",
            ) from None

    def create_folder(self, folder_id: str, quota_bytes: int | None) -> None:
        path = self.folder_path(folder_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(0o755)
        except FileExistsError:
            if not path.is_dir() or any(os.scandir(path)):
                raise StorageError(
                    StorageErrorType.EXISTS,
                    f"folder_id: expected a new folder, received {folder_id!r} (it exists"
                    " and is not empty)",
                ) from None
        self.set_quota(folder_id, quota_bytes)

    def delete_folder(self, folder_id: str) -> None:
        path = self.folder_path(folder_id)
        if path.exists():
            # Renamed away first: nobody sees a half-deleted folder under its name.
            doomed = path.with_name(f".deleting-{folder_id}-{secrets.token_hex(4)}")
            with contextlib.suppress(FileNotFoundError):
                path.rename(doomed)
                shutil.rmtree(doomed)
        with contextlib.suppress(FileNotFoundError):
            (self.quotas / folder_id).unlink()
        for session in self._sessions():
            if session.folder_id == folder_id:
                self._drop_session(session.session)

    def clone_folder(self, source: str, target: str) -> None:
        src = self.folder_path(source)
        if not src.is_dir():
            raise StorageError(
                StorageErrorType.NO_FOLDER,
                f"source.folder_id: expected a folder on volume {self.name!r}, received {source!r}",
            )
        dst = self.folder_path(target)
        if dst.exists():
            raise StorageError(
                StorageErrorType.EXISTS,
                f"target.folder_id: expected a new folder, received {target!r} (it exists)",
            )
        dst.parent.mkdir(parents=True, exist_ok=True)
        staging = dst.with_name(f".cloning-{target}-{secrets.token_hex(4)}")
        try:
            shutil.copytree(src, staging, symlinks=True)
            os.rename(staging, dst)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        quota = self.quota(source)
        self.set_quota(target, quota)

    def set_quota(self, folder_id: str, quota_bytes: int | None) -> None:
        path = self.quotas / folder_id
        if quota_bytes is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        tmp = path.with_name(f".{folder_id}.{secrets.token_hex(4)}")
        tmp.write_text(f"{quota_bytes}\n")
        os.replace(tmp, path)

    def quota(self, folder_id: str) -> int | None:
        try:
            return int((self.quotas / folder_id).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def usage(self, folder_id: str) -> FolderUsage:
        root = self._root_fd(folder_id)
        try:
            count, used = _scan(root)
        finally:
            os.close(root)
        return FolderUsage(file_count=count, used_bytes=used, quota_bytes=self.quota(folder_id))

    def mount_path(self, folder_id: str) -> str:
        close_quietly(self._root_fd(folder_id))
        return str(self.folder_path(folder_id))

    # -- files ----------------------------------------------------------------------------
    def list_files(
        self, folder_id: str, path: str, *, limit: int, cursor: str | None
    ) -> FileListPage:
        items, next_cursor = self.list_raw(folder_id, path, limit=limit, cursor=cursor)
        return FileListPage(items=[FileEntry(**item) for item in items], next_cursor=next_cursor)

    def list_raw(
        self, folder_id: str, path: str, *, limit: int, cursor: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page as plain :class:`FileEntry` dicts (no model per entry: a page of 5000
        is serialised straight to JSON) and the next page's cursor (None: the last)."""
        parts = split_relpath(path)
        root = self._root_fd(folder_id)
        try:
            parent, name = walk(root, parts, follow_last=True, shown=path)
        finally:
            os.close(root)
        try:
            if name is None:
                dir_fd = os.dup(parent)
            else:
                dir_fd = open_dir(name, parent, field="path", shown=path)
        finally:
            os.close(parent)
        try:
            names = self._sorted_names(dir_fd)
            start = bisect.bisect_right(names, cursor) if cursor is not None else 0
            page = names[start : start + limit]
            items: list[dict[str, Any]] = []
            lstat, is_dir, is_link, imode = os.stat, stat.S_ISDIR, stat.S_ISLNK, stat.S_IMODE
            for entry in page:
                try:
                    info = lstat(entry, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed since the directory was read
                mode = info.st_mode
                items.append(
                    {
                        "name": entry,
                        "type": "dir" if is_dir(mode) else "symlink" if is_link(mode) else "file",
                        "size": info.st_size,
                        "mode": imode(mode),
                        "created": info.st_ctime,
                        "modified": info.st_mtime,
                    }
                )
        finally:
            os.close(dir_fd)
        more = start + limit < len(names)
        return items, (page[-1] if more and page else None)

    def _sorted_names(self, dir_fd: int) -> list[str]:
        info = os.fstat(dir_fd)
        key = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
        with self._names_lock:
            cached = self._names.get(key)
            if cached is not None:
                self._names.move_to_end(key)
                return cached
        with os.scandir(dir_fd) as it:
            names = sorted(entry.name for entry in it)
        # A directory changed within the file system's timestamp granularity could
        # change again without a new mtime: only older ones are cached.
        if time.time() - info.st_mtime > _RACY_S:
            with self._names_lock:
                self._names[key] = names
                while len(self._names) > _LISTING_CACHE:
                    self._names.popitem(last=False)
        return names

    def mkdir(self, folder_id: str, paths: list[str], *, parents: bool, exist_ok: bool) -> None:
        checked = [(p, split_relpath(p, field="paths", allow_root=False)) for p in paths]
        root = self._root_fd(folder_id)
        try:
            for shown, parts in checked:
                parent, name = walk(
                    root, parts, follow_last=False, create_dirs=parents, field="paths", shown=shown
                )
                try:
                    assert name is not None
                    try:
                        os.mkdir(name, 0o755, dir_fd=parent)
                    except FileExistsError:
                        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                        if not (exist_ok and stat.S_ISDIR(info.st_mode)):
                            raise StorageError(
                                StorageErrorType.EXISTS,
                                f"paths: expected a new directory, received {shown!r} (it exists)",
                            ) from None
                finally:
                    os.close(parent)
        finally:
            os.close(root)

    def move(self, folder_id: str, source: str, target: str) -> None:
        src_parts = split_relpath(source, field="source", allow_root=False)
        dst_parts = split_relpath(target, field="target", allow_root=False)
        root = self._root_fd(folder_id)
        try:
            src_dir, src_name = walk(
                root, src_parts, follow_last=False, field="source", shown=source
            )
            try:
                dst_dir, dst_name = walk(
                    root, dst_parts, follow_last=False, field="target", shown=target
                )
            except BaseException:
                os.close(src_dir)
                raise
        finally:
            os.close(root)
        try:
            assert src_name is not None
            assert dst_name is not None
            try:
                os.stat(src_name, dir_fd=src_dir, follow_symlinks=False)
            except FileNotFoundError:
                raise StorageError(
                    StorageErrorType.NO_FILE,
                    f"source: expected a file or directory in the folder, received {source!r}",
                ) from None
            if _exists(dst_name, dst_dir):
                raise StorageError(
                    StorageErrorType.EXISTS,
                    f"target: expected a free name, received {target!r} (it exists)",
                )
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise StorageError(
                        StorageErrorType.BAD_PATH,
                        f"target: expected a place outside {source!r}, received {target!r}",
                    ) from None
                raise
        finally:
            os.close(src_dir)
            os.close(dst_dir)

    def delete(self, folder_id: str, paths: list[str], *, recursive: bool) -> None:
        checked = [(p, split_relpath(p, field="paths", allow_root=False)) for p in paths]
        root = self._root_fd(folder_id)
        targets: list[tuple[int, str, str, bool]] = []
        try:
            for shown, parts in checked:
                parent, name = walk(root, parts, follow_last=False, field="paths", shown=shown)
                assert name is not None
                try:
                    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    os.close(parent)
                    raise StorageError(
                        StorageErrorType.NO_FILE,
                        f"paths: expected a file or directory in the folder, received {shown!r}",
                    ) from None
                targets.append((parent, name, shown, stat.S_ISDIR(info.st_mode)))
            for parent, name, shown, is_dir in targets:
                if not is_dir:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=parent)
                elif recursive:
                    shutil.rmtree(name, dir_fd=parent)
                else:
                    try:
                        os.rmdir(name, dir_fd=parent)
                    except OSError as e:
                        if e.errno != errno.ENOTEMPTY:
                            raise
                        raise StorageError(
                            StorageErrorType.NOT_EMPTY,
                            f"paths: expected an empty directory (or recursive=true), received"
                            f" {shown!r}",
                        ) from None
        finally:
            os.close(root)
            for parent, *_ in targets:
                close_quietly(parent)

    def open_for_read(self, folder_id: str, path: str) -> OpenFile | OpenDir:
        """A regular file or a directory, opened for reading (the caller closes it)."""
        parts = split_relpath(path)
        root = self._root_fd(folder_id)
        try:
            parent, name = walk(root, parts, follow_last=True, shown=path)
        finally:
            os.close(root)
        try:
            if name is None:
                return OpenDir(fd=os.dup(parent), name=parts[-1] if parts else folder_id)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=parent)  # fmt: skip
            except FileNotFoundError:
                raise StorageError(
                    StorageErrorType.NO_FILE,
                    f"path: expected a file or directory in the folder, received {path!r}",
                ) from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise StorageError(
                        StorageErrorType.BAD_PATH,
                        f"path: expected no symbolic link leaving the folder, received {path!r}",
                    ) from None
                raise
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                os.close(fd)
                return OpenDir(fd=open_dir(name, parent, field="path", shown=path), name=name)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise StorageError(
                    StorageErrorType.BAD_REQUEST,
                    f"path: expected a regular file or a directory, received {path!r}",
                )
            os.set_blocking(fd, True)
            return OpenFile(fd=fd, name=name, size=info.st_size, mtime=info.st_mtime)
        finally:
            os.close(parent)

    # -- uploads --------------------------------------------------------------------------
    def start_upload(self, folder_id: str, path: str, size: int, *, ttl_s: int) -> UploadSession:
        parts = split_relpath(path, allow_root=False)
        root = self._root_fd(folder_id)
        try:
            parent, name = walk(root, parts, follow_last=False, create_dirs=True, shown=path)
        finally:
            os.close(root)
        try:
            assert name is not None
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise StorageError(
                        StorageErrorType.EXISTS,
                        f"path: expected a file name, received {path!r} (a directory)",
                    )
        finally:
            os.close(parent)
        quota = self.quota(folder_id)
        if quota is not None:
            used = self.usage(folder_id).used_bytes
            pending = sum(
                s.size for s in self._sessions() if s.folder_id == folder_id and not s.done
            )
            if used + pending + size > quota:
                raise StorageError(
                    StorageErrorType.OVER_QUOTA,
                    f"size: expected at most {max(0, quota - used - pending)} bytes (quota"
                    f" {quota}, used {used}, in open uploads {pending}), received {size}",
                )
        session = UploadSession(
            session=secrets.token_hex(16),
            folder_id=folder_id,
            path="/".join(parts),
            size=size,
            expires=time.time() + ttl_s + 60,
        )
        self._part(session.session).touch(0o600)
        self._save(session)
        if size == 0:  # tus clients send no PATCH for an empty file
            self.finish_upload(session)
            session = session.model_copy(update={"done": True})
        return session

    def _part(self, session_id: str) -> Path:
        return self.uploads / f"{session_id}.part"

    def _meta(self, session_id: str) -> Path:
        return self.uploads / f"{session_id}.json"

    def _save(self, session: UploadSession) -> None:
        tmp = self.uploads / f".{session.session}.{secrets.token_hex(4)}"
        tmp.write_text(session.model_dump_json())
        os.replace(tmp, self._meta(session.session))

    def load_session(self, session_id: str) -> UploadSession | None:
        try:
            return UploadSession.model_validate_json(self._meta(session_id).read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def _sessions(self) -> Iterator[UploadSession]:
        for meta in self.uploads.glob("*.json"):
            session = self.load_session(meta.stem)
            if session is not None:
                yield session

    def _drop_session(self, session_id: str) -> None:
        for path in (self._part(session_id), self._meta(session_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def open_part(self, session: UploadSession) -> int:
        """The session's partial file for writing (its size is the upload's offset)."""
        try:
            return os.open(self._part(session.session), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StorageError(
                StorageErrorType.NO_FILE,
                f"token: expected an open upload session, received {session.session!r} (gone)",
            ) from None

    def part_offset(self, session: UploadSession) -> int:
        if session.done:
            return session.size
        try:
            return self._part(session.session).stat().st_size
        except FileNotFoundError:
            return 0

    def finish_upload(self, session: UploadSession, dst_dir: tuple[str, ...] = ()) -> None:
        """Move the whole partial file under its name in the folder (atomically);
        ``dst_dir``: a directory the path is relative to (the client's ``dst_dir``)."""
        part = self._part(session.session)
        fd = os.open(part, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        root = self._root_fd(session.folder_id)
        try:
            parent, name = walk(
                root, dst_dir + split_relpath(session.path), follow_last=False,
                create_dirs=True, shown=session.path,
            )  # fmt: skip
        finally:
            os.close(root)
        try:
            assert name is not None
            uploads_fd = os.open(self.uploads, DIR_FLAGS)
            try:
                os.chmod(part, 0o644)
                os.rename(part.name, name, src_dir_fd=uploads_fd, dst_dir_fd=parent)
            except IsADirectoryError:
                raise StorageError(
                    StorageErrorType.EXISTS,
                    f"path: expected a file name, received {session.path!r} (a directory)",
                ) from None
            finally:
                os.close(uploads_fd)
            os.fsync(parent)
        finally:
            os.close(parent)
        self._save(session.model_copy(update={"done": True}))

    def sweep_uploads(self, now: float | None = None) -> int:
        """Drop expired sessions (and their partial files); returns how many."""
        current = time.time() if now is None else now
        dropped = 0
        for session in list(self._sessions()):
            if session.expires < current:
                self._drop_session(session.session)
                dropped += 1
        return dropped


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _scan(dir_fd: int) -> tuple[int, int]:
    """(regular files, their bytes) under ``dir_fd``, links not followed."""
    count = used = 0
    with os.scandir(dir_fd) as it:
        entries = list(it)
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            count += 1
            used += info.st_size
        elif stat.S_ISDIR(info.st_mode):
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                c, u = _scan(sub)
            finally:
                os.close(sub)
            count += c
            used += u
    return count, used
