"""An in-process storage proxy for manager tests: the contract of
:mod:`accelshare.protocol.storage` over a directory, as a FastAPI app.

    fake = FakeStorageProxy(tmp_path / "volumes", volumes=["vol1"], secret="s3cret")
    transport = fake.transport            # httpx.ASGITransport: give it to the manager
    await fake.register(store, "local")   # volumes/proxies/local/... and default_host

It keeps every folder at ``<root>/<volume>/<folder id>``, enforces quotas on upload from
a usage scan, refuses path traversal (``bad-path``), and serves a minimal tus upload
(``OPTIONS`` / ``HEAD`` / ``PATCH`` with a partial file moved under its name when
complete) and ``GET /download`` with the tickets it issues.  ``calls`` records every
manager-facing request (route, body) for assertions; ``fail["create"] = kind`` makes
the next call of that route answer a problem of that type.

Not a product: the real proxy is ``accelshare.storage``; this exists so the manager's
folder code is tested against the contract without it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from accelshare.config import ConfigStore
from accelshare.protocol.storage import (
    STORAGE_SECRET_HEADER,
    DeleteRequest,
    DownloadRequest,
    FileEntry,
    FileListPage,
    FileListRequest,
    FolderClone,
    FolderCreate,
    FolderMount,
    FolderQuota,
    FolderRef,
    FolderUsage,
    MkdirRequest,
    MoveRequest,
    StorageErrorType,
    TransferTicket,
    UploadRequest,
    VolumeInfo,
    VolumeList,
)

__all__ = ["FakeStorageProxy"]

MANAGER_URL = "http://fake-storage-manager"
CLIENT_URL = "http://fake-storage-client"


class _Refused(Exception):
    def __init__(self, kind: StorageErrorType, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status


@dataclass
class _Ticket:
    volume: str
    folder_id: str
    path: str
    op: str  # "upload" | "download"
    size: int
    archive: bool
    expires: float
    offset: int = 0


class FakeStorageProxy:
    def __init__(
        self,
        root: Path,
        *,
        volumes: list[str] | None = None,
        secret: str = "fake-storage-secret",
        manager_url: str = MANAGER_URL,
        client_url: str = CLIENT_URL,
    ) -> None:
        self.root = root
        self.secret = secret
        self.manager_url = manager_url
        self.client_url = client_url
        self.volumes = volumes or ["vol1"]
        for volume in self.volumes:
            (root / volume).mkdir(parents=True, exist_ok=True)
        self.quotas: dict[tuple[str, str], int | None] = {}
        self.tickets: dict[str, _Ticket] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail: dict[str, StorageErrorType] = {}
        self.app = self._build()
        self.transport = httpx.ASGITransport(app=self.app)

    async def register(self, store: ConfigStore, name: str = "local") -> None:
        await store.put(f"volumes/proxies/{name}/manager_api", self.manager_url)
        await store.put(f"volumes/proxies/{name}/client_api", self.client_url)
        await store.put(f"volumes/proxies/{name}/secret", self.secret)
        await store.put("volumes/default_host", f"{name}:{self.volumes[0]}")

    def client(self) -> httpx.AsyncClient:
        """A client for the client-facing API (what a user's CLI does)."""
        return httpx.AsyncClient(transport=self.transport, base_url=self.client_url)

    # -- the folder tree -----------------------------------------------------------------

    def folder_dir(self, volume: str, folder_id: str) -> Path:
        if volume not in self.volumes:
            raise _Refused(StorageErrorType.NO_VOLUME, f"No volume {volume!r}", 404)
        return self.root / volume / folder_id

    def _existing(self, ref: FolderRef) -> Path:
        path = self.folder_dir(ref.volume, ref.folder_id)
        if not path.is_dir():
            raise _Refused(StorageErrorType.NO_FOLDER, f"No folder {ref.folder_id}", 404)
        return path

    def _inside(self, base: Path, rel: str, field: str = "path") -> Path:
        if "\x00" in rel or rel.startswith("/") or ".." in PurePosixPath(rel).parts:
            raise _Refused(StorageErrorType.BAD_PATH, f"{field}: {rel!r} leaves the folder")
        target = (base / rel).resolve()
        if target != base.resolve() and base.resolve() not in target.parents:
            raise _Refused(StorageErrorType.BAD_PATH, f"{field}: {rel!r} leaves the folder")
        return target

    def usage_of(self, base: Path) -> tuple[int, int]:
        count = size = 0
        for entry in base.rglob("*"):
            if entry.is_file() and not entry.name.startswith(".partial-"):
                count += 1
                size += entry.stat().st_size
        return count, size

    # -- the app -------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.exception_handler(_Refused)
        async def refused(_request: Request, exc: Exception) -> JSONResponse:
            assert isinstance(exc, _Refused)
            return JSONResponse(
                {
                    "type": exc.kind.value,
                    "title": exc.kind.value,
                    "detail": exc.detail,
                    "status": exc.status,
                },
                status_code=exc.status,
                media_type="application/problem+json",
            )

        async def body(request: Request, route: str) -> dict[str, Any]:
            if request.headers.get(STORAGE_SECRET_HEADER) != self.secret:
                raise _Refused(StorageErrorType.BAD_SECRET, "wrong secret", 401)
            raw = await request.body()
            data: dict[str, Any] = json.loads(raw) if raw else {}
            self.calls.append((route, data))
            kind = self.fail.pop(route, None)
            if kind is not None:
                raise _Refused(kind, f"injected {kind.value}")
            return data

        @app.get("/v1/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/volumes")
        async def volumes(request: Request) -> Response:
            await body(request, "volumes")
            listing = VolumeList(
                volumes=[
                    VolumeInfo(name=v, path=str(self.root / v), capabilities=[])
                    for v in self.volumes
                ]
            )
            return Response(listing.model_dump_json(), media_type="application/json")

        @app.post("/v1/folders/create", status_code=204)
        async def create(request: Request) -> None:
            req = FolderCreate.model_validate(await body(request, "create"))
            path = self.folder_dir(req.volume, req.folder_id)
            if path.exists() and any(path.iterdir()):
                raise _Refused(StorageErrorType.EXISTS, f"{req.folder_id} exists", 409)
            path.mkdir(parents=True, exist_ok=True)
            self.quotas[(req.volume, req.folder_id)] = req.quota_bytes

        @app.post("/v1/folders/delete", status_code=204)
        async def delete(request: Request) -> None:
            req = FolderRef.model_validate(await body(request, "delete"))
            shutil.rmtree(self.folder_dir(req.volume, req.folder_id), ignore_errors=True)

        @app.post("/v1/folders/clone", status_code=204)
        async def clone(request: Request) -> None:
            req = FolderClone.model_validate(await body(request, "clone"))
            source = self._existing(req.source)
            target = self.folder_dir(req.target.volume, req.target.folder_id)
            if target.exists():
                raise _Refused(StorageErrorType.EXISTS, f"{req.target.folder_id} exists", 409)
            shutil.copytree(source, target, symlinks=True)

        @app.post("/v1/folders/usage")
        async def usage(request: Request) -> Response:
            req = FolderRef.model_validate(await body(request, "usage"))
            count, size = self.usage_of(self._existing(req))
            answer = FolderUsage(
                file_count=count,
                used_bytes=size,
                quota_bytes=self.quotas.get((req.volume, req.folder_id)),
            )
            return Response(answer.model_dump_json(), media_type="application/json")

        @app.post("/v1/folders/quota", status_code=204)
        async def quota(request: Request) -> None:
            req = FolderQuota.model_validate(await body(request, "quota"))
            self._existing(req)
            self.quotas[(req.volume, req.folder_id)] = req.quota_bytes

        @app.post("/v1/folders/mount")
        async def mount(request: Request) -> Response:
            req = FolderRef.model_validate(await body(request, "mount"))
            answer = FolderMount(path=str(self._existing(req)))
            return Response(answer.model_dump_json(), media_type="application/json")

        @app.post("/v1/files/list")
        async def list_files(request: Request) -> Response:
            req = FileListRequest.model_validate(await body(request, "list"))
            target = self._inside(self._existing(req), req.path)
            if not target.is_dir():
                raise _Refused(StorageErrorType.NO_FILE, f"No directory {req.path!r}", 404)
            names = sorted(p for p in os.listdir(target) if not p.startswith(".partial-"))
            start = int(req.cursor or 0)
            chunk = names[start : start + req.limit]
            items = []
            for name in chunk:
                st = (target / name).lstat()
                kind = (
                    "symlink"
                    if (target / name).is_symlink()
                    else "dir"
                    if (target / name).is_dir()
                    else "file"
                )
                items.append(
                    FileEntry(
                        name=name,
                        type=kind,
                        size=st.st_size,
                        mode=st.st_mode & 0o7777,
                        created=st.st_ctime,
                        modified=st.st_mtime,
                    )
                )
            following = start + req.limit
            page = FileListPage(
                items=items, next_cursor=str(following) if following < len(names) else None
            )
            return Response(page.model_dump_json(), media_type="application/json")

        @app.post("/v1/files/mkdir", status_code=204)
        async def mkdir(request: Request) -> None:
            req = MkdirRequest.model_validate(await body(request, "mkdir"))
            base = self._existing(req)
            for rel in req.paths:
                target = self._inside(base, rel)
                try:
                    target.mkdir(parents=req.parents, exist_ok=req.exist_ok)
                except FileExistsError:
                    raise _Refused(StorageErrorType.EXISTS, f"{rel!r} exists", 409) from None
                except FileNotFoundError:
                    raise _Refused(
                        StorageErrorType.NO_FILE, f"the parent of {rel!r} is missing", 404
                    ) from None

        @app.post("/v1/files/move", status_code=204)
        async def move(request: Request) -> None:
            req = MoveRequest.model_validate(await body(request, "move"))
            base = self._existing(req)
            source = self._inside(base, req.source, "source")
            target = self._inside(base, req.target, "target")
            if not source.exists():
                raise _Refused(StorageErrorType.NO_FILE, f"No file {req.source!r}", 404)
            if target.exists():
                raise _Refused(StorageErrorType.EXISTS, f"{req.target!r} exists", 409)
            source.rename(target)

        @app.post("/v1/files/delete", status_code=204)
        async def delete_files(request: Request) -> None:
            req = DeleteRequest.model_validate(await body(request, "delete-files"))
            base = self._existing(req)
            for rel in req.paths:
                target = self._inside(base, rel)
                if not target.exists():
                    raise _Refused(StorageErrorType.NO_FILE, f"No file {rel!r}", 404)
                if target.is_dir():
                    if not req.recursive and any(target.iterdir()):
                        raise _Refused(StorageErrorType.NOT_EMPTY, f"{rel!r} is not empty", 409)
                    shutil.rmtree(target)
                else:
                    target.unlink()

        @app.post("/v1/files/upload")
        async def upload(request: Request) -> Response:
            req = UploadRequest.model_validate(await body(request, "upload"))
            base = self._existing(req)
            self._inside(base, req.path)
            limit = self.quotas.get((req.volume, req.folder_id))
            if limit is not None and self.usage_of(base)[1] + req.size > limit:
                raise _Refused(
                    StorageErrorType.OVER_QUOTA,
                    f"size: {req.size} bytes would exceed the folder's quota of {limit}",
                    413,
                )
            return self._ticket(req.volume, req.folder_id, req.path, "upload", req.size, False)

        @app.post("/v1/files/download")
        async def download(request: Request) -> Response:
            req = DownloadRequest.model_validate(await body(request, "download"))
            target = self._inside(self._existing(req), req.path)
            if not target.is_file():
                raise _Refused(StorageErrorType.NO_FILE, f"No file {req.path!r}", 404)
            return self._ticket(req.volume, req.folder_id, req.path, "download", 0, req.archive)

        # -- client-facing: tus upload and download --

        def ticket_of(request: Request, op: str) -> _Ticket:
            ticket = self.tickets.get(request.query_params.get("token", ""))
            if ticket is None or ticket.op != op or ticket.expires < time.monotonic():
                raise _Refused(StorageErrorType.BAD_TOKEN, "bad or expired token", 403)
            return ticket

        tus = {"Tus-Resumable": "1.0.0"}

        @app.options("/upload")
        async def tus_options() -> Response:
            return Response(status_code=204, headers={**tus, "Tus-Version": "1.0.0"})

        @app.head("/upload")
        async def tus_head(request: Request) -> Response:
            t = ticket_of(request, "upload")
            headers = {**tus, "Upload-Offset": str(t.offset), "Upload-Length": str(t.size)}
            return Response(status_code=200, headers=headers)

        @app.patch("/upload")
        async def tus_patch(request: Request) -> Response:
            t = ticket_of(request, "upload")
            offset = int(request.headers.get("Upload-Offset", "-1"))
            if offset != t.offset:
                raise _Refused(StorageErrorType.UPLOAD_CONFLICT, f"offset {offset}", 409)
            base = self.folder_dir(t.volume, t.folder_id)
            final = self._inside(base, t.path)
            partial = final.with_name(f".partial-{final.name}")
            final.parent.mkdir(parents=True, exist_ok=True)
            data = await request.body()
            with partial.open("ab") as f:
                f.write(data)
            t.offset += len(data)
            if t.offset >= t.size:
                partial.replace(final)
            return Response(status_code=204, headers={**tus, "Upload-Offset": str(t.offset)})

        @app.get("/download")
        async def get_file(request: Request) -> Response:
            t = ticket_of(request, "download")
            target = self._inside(self.folder_dir(t.volume, t.folder_id), t.path)
            return FileResponse(target, filename=target.name)

        return app

    def _ticket(
        self, volume: str, folder_id: str, path: str, op: str, size: int, archive: bool
    ) -> Response:
        token = secrets.token_urlsafe(16)
        self.tickets[token] = _Ticket(
            volume, folder_id, path, op, size, archive, time.monotonic() + 300
        )
        answer = TransferTicket(token=token, url=f"{self.client_url}/{op}")
        return Response(answer.model_dump_json(), media_type="application/json")
