"""The storage proxy's two HTTP faces (FastAPI), over one :class:`StorageProxy`.

:func:`manager_app` serves the manager-facing API (every request carries the proxy's
secret); :func:`client_app` serves clients (tus uploads and downloads, each authorised
by a token from a :class:`~accelshare.protocol.storage.TransferTicket`).  Routes and
models: :mod:`accelshare.protocol.storage`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from accelshare.protocol.storage import (
    STORAGE_SECRET_HEADER,
    DeleteRequest,
    DownloadRequest,
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
    VolumeList,
)

from .config import StorageConfig
from .errors import StorageError
from .paths import split_relpath
from .tokens import TokenClaims, TokenSigner
from .transfer import CHUNK, iter_file, iter_zip
from .vfs import OpenDir, UploadSession, Volume

__all__ = ["StorageProxy", "client_app", "manager_app"]

log = logging.getLogger(__name__)
T = TypeVar("T")
TUS_VERSION = "1.0.0"
_TUS_HEADERS = "Tus-Resumable, Upload-Length, Upload-Metadata, Upload-Offset, Content-Type"
# what a browser (the console, on another origin) may send and read: ``cors-origins``
_CORS_REQUEST_HEADERS = ["Tus-Resumable", "Upload-Length", "Upload-Offset", "Content-Type"]
_CORS_EXPOSED_HEADERS = ["Upload-Offset", "Upload-Length", "Tus-Resumable"]
_WRITE_BUFFER = 4 * CHUNK
_MAX_IOV = 1024  # pieces in one pwritev (the kernel's IOV_MAX)


class StorageProxy:
    """The volumes, the token signer and the upload sessions in progress."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.volumes = {
            name: Volume(name, Path(section.path)) for name, section in config.volume.items()
        }
        self.signer = TokenSigner(config.storage_proxy.secret)
        self.patching: set[tuple[str, str]] = set()

    def prepare(self) -> None:
        for volume in self.volumes.values():
            volume.prepare()
            volume.sweep_uploads()

    def volume(self, name: str, field: str = "volume") -> Volume:
        try:
            return self.volumes[name]
        except KeyError:
            raise StorageError(
                StorageErrorType.NO_VOLUME,
                f"{field}: expected one of {sorted(self.volumes)}, received {name!r}",
            ) from None

    def ticket(self, claims: TokenClaims, route: str) -> TransferTicket:
        url = f"{self.config.storage_proxy.public_client_url}/{route}"
        return TransferTicket(token=self.signer.issue(claims), url=url)

    def expiry(self) -> float:
        return time.time() + self.config.storage_proxy.token_ttl


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def _problem(error: StorageError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        error.problem(),
        status_code=error.status,
        media_type="application/problem+json",
        headers=headers,
    )


def _install_errors(app: FastAPI) -> None:
    async def on_storage_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StorageError)
        return _problem(exc)

    async def on_validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if p != "body"]
        received = err.get("input")
        detail = (
            f"{'.'.join(loc) or 'body'}: expected {str(err['msg']).removeprefix('Input should be ')}"
            f", received {received!r}"[:500]
        )
        return _problem(StorageError(StorageErrorType.BAD_REQUEST, detail))

    app.add_exception_handler(StorageError, on_storage_error)
    app.add_exception_handler(RequestValidationError, on_validation)


# -- the manager-facing API -----------------------------------------------------------------
def manager_app(proxy: StorageProxy) -> FastAPI:
    app = FastAPI(title="accelshare storage proxy (manager-facing)", docs_url=None, redoc_url=None)
    _install_errors(app)
    secret = proxy.config.storage_proxy.secret.encode("utf-8")

    async def check_secret(request: Request) -> None:
        given = request.headers.get(STORAGE_SECRET_HEADER, "").encode("utf-8")
        if not hmac.compare_digest(given, secret):
            raise StorageError(
                StorageErrorType.BAD_SECRET,
                f"{STORAGE_SECRET_HEADER}: expected the proxy's secret, received "
                + ("nothing" if not given else "another value"),
            )

    guarded = [Depends(check_secret)]

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/volumes", dependencies=guarded)
    async def volumes() -> VolumeList:
        infos = [await _run(v.info) for v in proxy.volumes.values()]
        return VolumeList(volumes=infos)

    @app.post("/v1/folders/create", dependencies=guarded, status_code=204)
    async def create(body: FolderCreate) -> None:
        await _run(proxy.volume(body.volume).create_folder, body.folder_id, body.quota_bytes)

    @app.post("/v1/folders/delete", dependencies=guarded, status_code=204)
    async def delete_folder(body: FolderRef) -> None:
        await _run(proxy.volume(body.volume).delete_folder, body.folder_id)

    @app.post("/v1/folders/clone", dependencies=guarded, status_code=204)
    async def clone(body: FolderClone) -> None:
        if body.source.volume != body.target.volume:
            raise StorageError(
                StorageErrorType.BAD_REQUEST,
                f"target.volume: expected the source's volume {body.source.volume!r}, received"
                f" {body.target.volume!r}",
            )
        volume = proxy.volume(body.source.volume, "source.volume")
        await _run(volume.clone_folder, body.source.folder_id, body.target.folder_id)

    @app.post("/v1/folders/usage", dependencies=guarded)
    async def usage(body: FolderRef) -> FolderUsage:
        return await _run(proxy.volume(body.volume).usage, body.folder_id)

    @app.post("/v1/folders/quota", dependencies=guarded, status_code=204)
    async def quota(body: FolderQuota) -> None:
        volume = proxy.volume(body.volume)
        await _run(volume.mount_path, body.folder_id)  # the folder must exist
        await _run(volume.set_quota, body.folder_id, body.quota_bytes)

    @app.post("/v1/folders/mount", dependencies=guarded)
    async def mount(body: FolderRef) -> FolderMount:
        return FolderMount(path=await _run(proxy.volume(body.volume).mount_path, body.folder_id))

    @app.post("/v1/files/list", dependencies=guarded, response_model=FileListPage)
    async def list_files(body: FileListRequest) -> Response:
        # serialised once here: FastAPI would validate the page's entries again
        items, next_cursor = await _run(
            proxy.volume(body.volume).list_raw,
            body.folder_id,
            body.path,
            limit=body.limit,
            cursor=body.cursor,
        )
        return Response(_listing_json(items, next_cursor), media_type="application/json")

    @app.post("/v1/files/mkdir", dependencies=guarded, status_code=204)
    async def mkdir(body: MkdirRequest) -> None:
        await _run(
            proxy.volume(body.volume).mkdir,
            body.folder_id,
            body.paths,
            parents=body.parents,
            exist_ok=body.exist_ok,
        )

    @app.post("/v1/files/move", dependencies=guarded, status_code=204)
    async def move(body: MoveRequest) -> None:
        await _run(proxy.volume(body.volume).move, body.folder_id, body.source, body.target)

    @app.post("/v1/files/delete", dependencies=guarded, status_code=204)
    async def delete_files(body: DeleteRequest) -> None:
        await _run(
            proxy.volume(body.volume).delete, body.folder_id, body.paths, recursive=body.recursive
        )

    @app.post("/v1/files/upload", dependencies=guarded)
    async def upload(body: UploadRequest) -> TransferTicket:
        volume = proxy.volume(body.volume)
        session = await _run(
            volume.start_upload,
            body.folder_id,
            body.path,
            body.size,
            ttl_s=proxy.config.storage_proxy.token_ttl,
        )
        claims = TokenClaims(
            op="upload",
            volume=body.volume,
            folder_id=body.folder_id,
            path=session.path,
            size=body.size,
            session=session.session,
            exp=proxy.expiry(),
        )
        return proxy.ticket(claims, "upload")

    @app.post("/v1/files/download", dependencies=guarded)
    async def download(body: DownloadRequest) -> TransferTicket:
        volume = proxy.volume(body.volume)
        opened = await _run(volume.open_for_read, body.folder_id, body.path)
        os.close(opened.fd)
        if isinstance(opened, OpenDir) and not body.archive:
            raise StorageError(
                StorageErrorType.BAD_REQUEST,
                f"archive: expected true for a directory ({body.path!r}), received false",
            )
        claims = TokenClaims(
            op="download",
            volume=body.volume,
            folder_id=body.folder_id,
            path="/".join(split_relpath(body.path)),
            archive=body.archive,
            exp=proxy.expiry(),
        )
        return proxy.ticket(claims, "download")

    return app


# -- the client-facing API ------------------------------------------------------------------
def _tus_headers(session: UploadSession, offset: int) -> dict[str, str]:
    return {
        "Tus-Resumable": TUS_VERSION,
        "Upload-Offset": str(offset),
        "Upload-Length": str(session.size),
        "Cache-Control": "no-store",
    }


def _content_disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "ignore").decode("ascii").replace('"', "")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name)}"


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, length) of a single ``bytes=`` range; None: the whole file.  Several
    ranges are answered with the whole file (RFC 9110 allows it)."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[6:].strip().partition("-")
    if not sep:
        return None
    try:
        if not first:  # the last N bytes
            count = int(last)
            if count <= 0:
                raise _unsatisfiable(header, size)
            return max(0, size - count), min(count, size)
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size:
        raise _unsatisfiable(header, size)
    if end < start:
        return None
    end = min(end, size - 1)
    return start, end - start + 1


class _Unsatisfiable(Exception):
    def __init__(self, header: str, size: int) -> None:
        super().__init__(header)
        self.size = size


def _unsatisfiable(header: str, size: int) -> _Unsatisfiable:
    return _Unsatisfiable(header, size)


def client_app(proxy: StorageProxy) -> FastAPI:
    app = FastAPI(title="accelshare storage proxy (client-facing)", docs_url=None, redoc_url=None)
    _install_errors(app)
    origins = list(proxy.config.storage_proxy.cors_origins)
    if origins:
        # only the listed web origins (the console's) may upload from a browser and read
        # the tus answers; errors carry the headers too, so the console can show them
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "HEAD", "PATCH", "OPTIONS"],
            allow_headers=_CORS_REQUEST_HEADERS,
            expose_headers=_CORS_EXPOSED_HEADERS,
            max_age=600,
        )

    def upload_session(request: Request) -> tuple[Volume, UploadSession]:
        claims = proxy.signer.verify(request.query_params.get("token"), op="upload")
        volume = proxy.volume(claims.volume)
        assert claims.session is not None
        session = volume.load_session(claims.session)
        if session is None or session.folder_id != claims.folder_id or session.path != claims.path:
            raise StorageError(
                StorageErrorType.NO_FILE,
                "token: expected an open upload session, received one that ended or expired",
                status=404,
            )
        return volume, session

    @app.get("/")
    async def status() -> dict[str, str]:
        return {"status": "ok", "type": "client-facing"}

    @app.options("/upload")
    async def tus_options() -> Response:
        return Response(
            status_code=204,
            headers={
                "Tus-Resumable": TUS_VERSION,
                "Tus-Version": TUS_VERSION,
            },
        )

    @app.head("/upload")
    async def tus_head(request: Request) -> Response:
        volume, session = await _run(upload_session, request)
        offset = await _run(volume.part_offset, session)
        return Response(status_code=200, headers=_tus_headers(session, offset))

    @app.patch("/upload")
    async def tus_patch(request: Request) -> Response:
        volume, session = await _run(upload_session, request)
        if request.headers.get("content-type", "") != "application/offset+octet-stream":
            return _problem(
                StorageError(
                    StorageErrorType.BAD_REQUEST,
                    "Content-Type: expected 'application/offset+octet-stream', received"
                    f" {request.headers.get('content-type')!r}",
                    status=415,
                )
            )
        claimed = request.headers.get("upload-offset", "")
        if not claimed.isdigit():
            raise StorageError(
                StorageErrorType.BAD_REQUEST,
                f"Upload-Offset: expected a byte offset, received {claimed!r}",
            )
        key = (volume.name, session.session)
        if key in proxy.patching:
            raise StorageError(
                StorageErrorType.UPLOAD_CONFLICT,
                "Upload-Offset: expected one PATCH at a time, received one while another is"
                " still writing (HEAD for the offset, then retry)",
            )
        proxy.patching.add(key)
        try:
            offset = await _run(volume.part_offset, session)
            if session.done or int(claimed) != offset:
                raise StorageError(
                    StorageErrorType.UPLOAD_CONFLICT,
                    f"Upload-Offset: expected {offset}, received {claimed}",
                )
            dst_dir = split_relpath(request.query_params.get("dst_dir", ""), field="dst_dir")
            offset = await _receive(request, volume, session, offset)
            if offset == session.size:
                await _run(volume.finish_upload, session, dst_dir)
        finally:
            proxy.patching.discard(key)
        return Response(status_code=204, headers=_tus_headers(session, offset))

    @app.api_route("/download", methods=["GET", "HEAD"])
    async def download(request: Request) -> Response:
        claims = proxy.signer.verify(request.query_params.get("token"), op="download")
        volume = proxy.volume(claims.volume)
        dst_dir = split_relpath(request.query_params.get("dst_dir", ""), field="dst_dir")
        path = "/".join((*dst_dir, claims.path))
        opened = await _run(volume.open_for_read, claims.folder_id, path)
        if isinstance(opened, OpenDir):
            if not claims.archive:
                os.close(opened.fd)
                raise StorageError(
                    StorageErrorType.BAD_REQUEST,
                    f"path: expected a file, received the directory {claims.path!r}",
                )
            if request.method == "HEAD":
                os.close(opened.fd)
                return Response(status_code=200, headers={"Content-Type": "application/zip"})
            return StreamingResponse(
                iter_zip(opened.fd),
                media_type="application/zip",
                headers={"Content-Disposition": _content_disposition(f"{opened.name}.zip")},
            )
        last_modified = formatdate(opened.mtime, usegmt=True)
        headers = {
            "Accept-Ranges": "bytes",
            "Last-Modified": last_modified,
            "Content-Disposition": _content_disposition(opened.name),
        }
        wanted = request.headers.get("range")
        if_range = request.headers.get("if-range")
        if wanted and if_range and not _fresh(if_range, opened.mtime):
            wanted = None  # the file changed: the whole of it
        try:
            span = _byte_range(wanted, opened.size)
        except _Unsatisfiable:
            os.close(opened.fd)
            return Response(status_code=416, headers={"Content-Range": f"bytes */{opened.size}"})
        start, length = span if span is not None else (0, opened.size)
        headers["Content-Length"] = str(length)
        status = 200
        if span is not None:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{opened.size}"
        if request.method == "HEAD":
            os.close(opened.fd)
            return Response(status_code=status, headers=headers)
        return StreamingResponse(
            iter_file(opened.fd, start, length),
            status_code=status,
            media_type="application/octet-stream",
            headers=headers,
        )

    return app


def _fresh(if_range: str, mtime: float) -> bool:
    try:
        return int(parsedate_to_datetime(if_range).timestamp()) >= int(mtime)
    except (TypeError, ValueError):
        return False


async def _receive(request: Request, volume: Volume, session: UploadSession, offset: int) -> int:
    """Append the body at ``offset`` (buffered, at most a few MiB held); returns the new
    offset.  What arrived before a disconnect is kept (the client resumes from it)."""
    fd = await _run(volume.open_part, session)
    start = offset
    pending: list[bytes] = []
    held = 0

    def flush(chunks: list[bytes], at: int) -> None:
        total = sum(len(c) for c in chunks)
        written = os.pwritev(fd, chunks, at)
        if written < total:  # short write: the rest one by one
            rest = memoryview(b"".join(chunks))[written:]
            at += written
            while rest:
                n = os.pwrite(fd, rest, at)
                rest, at = rest[n:], at + n

    try:
        try:
            async for chunk in request.stream():
                if offset + held + len(chunk) > session.size:
                    await _run(os.ftruncate, fd, start)
                    raise StorageError(
                        StorageErrorType.BAD_REQUEST,
                        f"body: expected at most {session.size - start} bytes (Upload-Length"
                        f" {session.size}), received more",
                    )
                if not chunk:
                    continue
                pending.append(chunk)
                held += len(chunk)
                if held >= _WRITE_BUFFER or len(pending) >= _MAX_IOV:
                    await _run(flush, pending, offset)
                    offset += held
                    pending, held = [], 0
        except ClientDisconnect:
            log.info("upload %s: the client left at offset %d", session.session, offset + held)
        if pending:
            await _run(flush, pending, offset)
            offset += held
    finally:
        await asyncio.shield(_run(os.close, fd))
    return offset


def _listing_json(items: list[dict[str, Any]], next_cursor: str | None) -> bytes:
    """A page as JSON: orjson (a 5000-entry page in a few ms); a page holding a name that
    is not UTF-8 (a lone surrogate, which orjson refuses) through the json module, its
    bytes kept as they are on disk (``surrogateescape``)."""
    page = {"items": items, "next_cursor": next_cursor}
    try:
        return orjson.dumps(page)
    except TypeError:
        text = json.dumps(page, ensure_ascii=False)
        return text.encode("utf-8", "surrogateescape")
