"""``client.folders``: storage folders (Backend.AI's vfolders; docs/folders.md).

The manager keeps the folders; their bytes move between this machine and the storage
proxy directly: :meth:`FoldersAPI.upload` asks the manager for a ticket
(``request-upload``), then sends the file with the tus protocol (``PATCH`` in chunks,
resumed from the proxy's ``Upload-Offset`` after a broken connection);
:meth:`FoldersAPI.download` streams ``GET /download`` to a partial file, renamed when
complete.  Folders are named by name or id.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from .errors import APIError, ConnectionFailed
from .http import HttpCaller, problem_of

__all__ = ["CHUNK_BYTES", "FoldersAPI"]

CHUNK_BYTES = 8 * 1024 * 1024
_TUS = {"Tus-Resumable": "1.0.0"}
_RETRIES = 5

Progress = Callable[[int, int], None]  # (bytes done, total)


def _key(name: str) -> str:
    return quote(name, safe="")


class FoldersAPI:
    def __init__(
        self, http: HttpCaller, *, storage_transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._http = http
        self._storage_transport = storage_transport

    # -- folders -------------------------------------------------------------------------

    async def hosts(self) -> dict[str, Any]:
        return dict(await self._http.request("GET", "/folders/_/hosts"))

    async def create(
        self,
        name: str,
        *,
        host: str | None = None,
        group: str | None = None,
        usage_mode: str = "general",
        permission: str = "rw",
        cloneable: bool = False,
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "host": host,
            "group": group,
            "usage_mode": usage_mode,
            "permission": permission,
            "cloneable": cloneable,
        }
        return dict(await self._http.request("POST", "/folders", json_body=body))

    async def list_folders(self, *, all_: bool = False) -> list[dict[str, Any]]:
        return list(await self._http.request("GET", "/folders", params={"all": all_ or None}))

    async def info(self, name: str) -> dict[str, Any]:
        return dict(await self._http.request("GET", f"/folders/{_key(name)}"))

    async def folder_id(self, name: str) -> str:
        answer = await self._http.request("GET", "/folders/_/id", params={"name": name})
        return str(answer["id"])

    async def rename(self, name: str, new_name: str) -> None:
        await self._http.request(
            "POST", f"/folders/{_key(name)}/rename", json_body={"new_name": new_name}
        )

    async def update_options(
        self, name: str, *, permission: str | None = None, cloneable: bool | None = None
    ) -> dict[str, Any]:
        """The folder's own permission and whether others may clone it (``None``: as it
        is); the folder's ``{id, name, permission, cloneable}`` after."""
        body = {"permission": permission, "cloneable": cloneable}
        return dict(
            await self._http.request(
                "POST", f"/folders/{_key(name)}/update-options", json_body=body
            )
        )

    async def delete(self, name: str) -> None:
        """To the trash."""
        await self._http.request("DELETE", "/folders", json_body={"id": await self.folder_id(name)})

    async def restore(self, name: str) -> None:
        fid = await self.folder_id(name)
        await self._http.request("POST", "/folders/restore-from-trash-bin", json_body={"id": fid})

    async def purge(self, name: str) -> None:
        fid = await self.folder_id(name)
        await self._http.request("POST", "/folders/delete-from-trash-bin", json_body={"id": fid})

    async def clone(
        self, name: str, target_name: str, *, target_host: str | None = None
    ) -> dict[str, Any]:
        body = {"target_name": target_name, "target_host": target_host}
        return dict(
            await self._http.request("POST", f"/folders/{_key(name)}/clone", json_body=body)
        )

    async def invite(
        self, name: str, emails: Sequence[str], *, permission: str = "rw"
    ) -> list[str]:
        body = {"perm": permission, "user_ids": list(emails)}
        answer = await self._http.request("POST", f"/folders/{_key(name)}/invite", json_body=body)
        return list(answer.get("invited_ids", []))

    async def invitations(self) -> list[dict[str, Any]]:
        answer = await self._http.request("GET", "/folders/invitations/list")
        return list(answer.get("invitations", []))

    async def accept(self, invitation_id: str) -> None:
        await self._http.request(
            "POST", "/folders/invitations/accept", json_body={"inv_id": invitation_id}
        )

    async def reject(self, invitation_id: str) -> None:
        await self._http.request(
            "DELETE", "/folders/invitations/delete", json_body={"inv_id": invitation_id}
        )

    async def share(self, name: str, emails: Sequence[str], *, permission: str = "rw") -> list[str]:
        body = {"permission": permission, "emails": list(emails)}
        answer = await self._http.request("POST", f"/folders/{_key(name)}/share", json_body=body)
        return list(answer.get("shared_emails", []))

    async def unshare(self, name: str, emails: Sequence[str]) -> list[str]:
        answer = await self._http.request(
            "DELETE", f"/folders/{_key(name)}/unshare", json_body={"emails": list(emails)}
        )
        return list(answer.get("unshared_emails", []))

    # -- files ---------------------------------------------------------------------------

    async def ls(self, name: str, path: str = ".") -> list[dict[str, Any]]:
        answer = await self._http.request(
            "GET", f"/folders/{_key(name)}/files", params={"path": path}
        )
        return list(answer.get("items", []))

    async def mkdir(
        self, name: str, paths: Sequence[str], *, parents: bool = False, exist_ok: bool = False
    ) -> dict[str, Any]:
        body = {"path": list(paths), "parents": parents, "exist_ok": exist_ok}
        answer = await self._http.request("POST", f"/folders/{_key(name)}/mkdir", json_body=body)
        return dict(answer["results"])

    async def move(self, name: str, src: str, dst: str) -> None:
        await self._http.request(
            "POST", f"/folders/{_key(name)}/move-file", json_body={"src": src, "dst": dst}
        )

    async def rm(self, name: str, paths: Sequence[str], *, recursive: bool = False) -> None:
        await self._http.request(
            "DELETE",
            f"/folders/{_key(name)}/delete-files",
            json_body={"files": list(paths), "recursive": recursive},
        )

    def _storage(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self._storage_transport, timeout=300)

    async def upload(
        self,
        name: str,
        source: Path,
        target: str | None = None,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        progress: Progress | None = None,
    ) -> None:
        """One file, as ``target`` (default: its name) in the folder."""
        size = source.stat().st_size
        ticket = await self._http.request(
            "POST",
            f"/folders/{_key(name)}/request-upload",
            json_body={"path": target or source.name, "size": size},
        )
        params = {"token": ticket["token"]}
        async with self._storage() as storage:
            offset = 0
            failures = 0
            with source.open("rb") as f:
                while offset < size or size == 0:
                    f.seek(offset)
                    chunk = f.read(chunk_bytes)
                    headers = {
                        **_TUS,
                        "Upload-Offset": str(offset),
                        "Content-Type": "application/offset+octet-stream",
                    }
                    try:
                        response = await storage.patch(
                            ticket["url"], params=params, content=chunk, headers=headers
                        )
                    except httpx.TransportError as e:
                        failures += 1
                        if failures > _RETRIES:
                            raise ConnectionFailed(
                                f"the upload to {ticket['url']} broke off at byte {offset}: {e}"
                            ) from e
                        offset = await self._upload_offset(storage, ticket["url"], params)
                        continue
                    if response.status_code >= 400:
                        raise APIError(response.status_code, problem_of(response, response.content))
                    offset = int(response.headers.get("Upload-Offset", offset + len(chunk)))
                    if progress is not None:
                        progress(offset, size)
                    if size == 0:
                        break

    async def _upload_offset(
        self, storage: httpx.AsyncClient, url: str, params: dict[str, str]
    ) -> int:
        response = await storage.head(url, params=params, headers=_TUS)
        if response.status_code >= 400:
            raise APIError(response.status_code, problem_of(response, response.content))
        return int(response.headers["Upload-Offset"])

    async def download(
        self, name: str, path: str, destination: Path, *, progress: Progress | None = None
    ) -> Path:
        """A file of the folder into ``destination`` (a directory: under its name);
        written to ``<name>.partial`` first, renamed once whole."""
        target = destination / Path(path).name if destination.is_dir() else destination
        if target.exists():
            raise FileExistsError(f"{target} exists: remove it or download elsewhere")
        ticket = await self._http.request(
            "POST", f"/folders/{_key(name)}/request-download", json_body={"path": path}
        )
        partial = target.with_name(target.name + ".partial")
        async with (
            self._storage() as storage,
            storage.stream("GET", ticket["url"], params={"token": ticket["token"]}) as response,
        ):
            if response.status_code >= 400:
                content = await response.aread()
                raise APIError(response.status_code, problem_of(response, content))
            total = int(response.headers.get("Content-Length", 0))
            done = 0
            with partial.open("wb") as f:
                async for block in response.aiter_bytes():
                    f.write(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, total)
        os.replace(partial, target)
        return target
