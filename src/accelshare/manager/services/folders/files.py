"""The files inside a folder: upload and download tickets of the storage proxy, listing,
directories, moves and deletes (``ro`` access reads only)."""

from __future__ import annotations

import json
import stat
from collections.abc import Sequence
from typing import Any

from accelshare.protocol.storage import (
    DeleteRequest,
    DownloadRequest,
    FileListRequest,
    MkdirRequest,
    MoveRequest,
    TransferTicket,
    UploadRequest,
)

from ...errors import InvalidRequest
from ...storage_client import StorageError
from ..actor import Actor
from .access import FolderCore
from .names import check_rel_path

__all__ = ["FolderFiles"]


def _mode_text(mode: int, kind: str) -> str:
    prefix = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(kind, stat.S_IFREG)
    return stat.filemode(prefix | mode)


class FolderFiles(FolderCore):
    """The files inside a folder, through its storage proxy."""

    async def request_upload(self, actor: Actor, ref: str, path: str, size: int) -> dict[str, Any]:
        check_rel_path(path, field="path")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest(
                "size is the file's length in bytes",
                field="size",
                expected="an integer >= 0",
                received=size,
            )
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        ticket = await proxy.upload(
            UploadRequest(volume=volume, folder_id=access.folder.id.hex, path=path, size=size)
        )
        return self._ticket(ticket)

    async def request_download(
        self, actor: Actor, ref: str, path: str, archive: bool = False
    ) -> dict[str, Any]:
        check_rel_path(path, field="path")
        access = await self._usable(actor, ref)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        ticket = await proxy.download(
            DownloadRequest(
                volume=volume, folder_id=access.folder.id.hex, path=path, archive=archive
            )
        )
        return self._ticket(ticket)

    @staticmethod
    def _ticket(ticket: TransferTicket) -> dict[str, Any]:
        return {"token": ticket.token, "url": ticket.url}

    async def list_files(self, actor: Actor, ref: str, path: str = ".") -> dict[str, Any]:
        check_rel_path(path or ".", field="path")
        access = await self._usable(actor, ref)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await proxy.list_files(
                FileListRequest(
                    volume=volume, folder_id=access.folder.id.hex, path=path or ".", cursor=cursor
                )
            )
            for item in page.items:
                entries.append(
                    {
                        "name": item.name,
                        "filename": item.name,
                        "type": item.type.upper() if item.type != "symlink" else "SYMLINK",
                        "size": item.size,
                        "mode": _mode_text(item.mode, item.type),
                        "ctime": item.created,
                        "mtime": item.modified,
                        "atime": item.modified,
                    }
                )
            cursor = page.next_cursor
            if cursor is None:
                break
        # 25.5's client reads "files" (a JSON text); newer ones read "items"
        return {"items": entries, "files": json.dumps(entries)}

    async def mkdir(
        self,
        actor: Actor,
        ref: str,
        paths: str | Sequence[str],
        *,
        parents: bool = False,
        exist_ok: bool = False,
    ) -> dict[str, Any]:
        if isinstance(paths, str):
            listed = [paths]
        elif isinstance(paths, list | tuple) and all(isinstance(p, str) for p in paths):
            listed = list(paths)
        else:
            raise InvalidRequest(
                "path: expected a directory path or a list of them",
                field="path",
                expected="a string or a list of strings",
                received=paths,
            )
        if not listed:
            raise InvalidRequest("path names at least one directory", field="path", received=paths)
        for index, p in enumerate(listed):
            check_rel_path(p, field=f"path[{index}]")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        success: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for p in listed:
            try:
                await proxy.mkdir(
                    MkdirRequest(
                        volume=volume,
                        folder_id=access.folder.id.hex,
                        paths=[p],
                        parents=parents,
                        exist_ok=exist_ok,
                    )
                )
            except StorageError as e:
                failed.append({"item": p, "msg": e.detail})
            else:
                success.append({"item": p, "msg": None})
        return {"results": {"success": success, "failed": failed}}

    async def rename_file(self, actor: Actor, ref: str, target_path: str, new_name: str) -> None:
        check_rel_path(target_path, field="target_path")
        check_rel_path(new_name, field="new_name")
        if "/" in new_name:
            raise InvalidRequest(
                "new_name is a file name, without '/'",
                field="new_name",
                expected="a name without '/'",
                received=new_name,
            )
        parent = target_path.rstrip("/").rpartition("/")[0]
        await self.move_file(
            actor, ref, target_path, f"{parent}/{new_name}" if parent else new_name
        )

    async def move_file(self, actor: Actor, ref: str, src: str, dst: str) -> None:
        check_rel_path(src, field="src")
        check_rel_path(dst, field="dst")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        await proxy.move(
            MoveRequest(volume=volume, folder_id=access.folder.id.hex, source=src, target=dst)
        )

    async def delete_files(
        self, actor: Actor, ref: str, files: Sequence[str], *, recursive: bool = False
    ) -> None:
        if isinstance(files, str) or not files:
            raise InvalidRequest(
                "files is a list of paths",
                field="files",
                expected="a non-empty list",
                received=files,
            )
        for index, f in enumerate(files):
            check_rel_path(f, field=f"files[{index}]")
        access = await self._usable(actor, ref, write=True)
        proxy, volume = await self.proxies.for_host(access.folder.host)
        await proxy.delete_files(
            DeleteRequest(
                volume=volume,
                folder_id=access.folder.id.hex,
                paths=list(files),
                recursive=recursive,
            )
        )
