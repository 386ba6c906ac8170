"""Backend.AI's session file routes: ``session upload``, ``session download``,
``session ls`` of the official client (and ``accelshare session upload|download|ls``).

| route | what |
|---|---|
| ``POST /session/{ref}/upload`` | ``multipart/form-data``, one part per file (its ``filename`` the path under ``/home/work``) -> 204 |
| ``POST\\|GET /session/{ref}/download`` | ``{"files": [path, ...]}`` (JSON body, or ``?files=`` repeated) -> ``multipart/mixed``, one ``application/x-tar`` part per path (a file, or a folder with everything in it) |
| ``GET /session/{ref}/files`` | ``{"path": path}`` (JSON body, or ``?path=``; default ``/home/work``) -> ``{"files": "<JSON list of {filename, size, mode, mtime, ctime, atime}>", "errors": "", "abspath": path}`` |

Paths are relative to ``/home/work`` or absolute under it.  Everything streams: an
upload's parts go to the agent as they arrive (no file is held whole in the manager),
a download's tars come from the agent as they are read.  The manager's 1 MiB body limit
does not apply to uploads; each file is held to the agent's ``[container]
file-upload-max-bytes`` (413).  Errors (:mod:`accelshare.manager.session_files`): 400 a
refused path, 404 no such session or file, 409 a session not RUNNING (naming its
status), a folder where a file is expected, a symlink leading out, a read-only mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from python_multipart.multipart import MultipartParser, parse_options_header

from accelshare.manager.errors import InvalidRequest
from accelshare.manager.services.sessions import ProxyTarget
from accelshare.protocol import FileUploadResult

from .auth import CurrentIdentity
from .deps import ManagerDep

__all__ = ["MAX_DOWNLOAD_FILES", "router"]

router = APIRouter(tags=["session files"])

MAX_DOWNLOAD_FILES = 100
"""Paths in one download (each holds a stream from the agent open)."""
_QUEUE_CHUNKS = 8


# -- upload ---------------------------------------------------------------------------------


@router.post("/session/{ref}/upload", status_code=204)
async def upload(
    ref: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> Response:
    target = await manager.session_files.target(identity, ref)
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "an upload is a multipart/form-data body, one part per file",
            field="content-type",
            expected="multipart/form-data; boundary=...",
            received=request.headers.get("content-type"),
        )
    uploaded = await _UploadParts(manager, target, ref, boundary).run(request.stream())
    if not uploaded:
        raise InvalidRequest(
            "no file in the upload: each part needs a filename",
            field="src",
            expected="one or more file parts",
            received=0,
        )
    return Response(status_code=204)


class _UploadParts:
    """Feeds a multipart body to the parser and each file part, as it arrives, to its
    own streamed PUT to the agent (one file at a time)."""

    def __init__(self, manager: Any, target: ProxyTarget, ref: str, boundary: bytes) -> None:
        self._manager, self._target, self._ref = manager, target, ref
        self._events: list[tuple[str, Any]] = []
        self._headers: dict[bytes, bytes] = {}
        self._field = bytearray()
        self._value = bytearray()
        callbacks: dict[str, Any] = {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": lambda: self._events.append(("file", dict(self._headers))),
            "on_part_data": lambda d, s, e: self._events.append(("data", bytes(d[s:e]))),
            "on_part_end": lambda: self._events.append(("end", None)),
        }
        self._parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]

    def _part_begin(self) -> None:
        self._headers.clear()

    def _header_end(self) -> None:
        self._headers[bytes(self._field).lower()] = bytes(self._value)
        self._field.clear()
        self._value.clear()

    async def run(self, body: AsyncIterator[bytes]) -> list[FileUploadResult]:
        results: list[FileUploadResult] = []
        current: tuple[asyncio.Queue[bytes | None], asyncio.Task[FileUploadResult]] | None = None
        try:
            async for chunk in body:
                self._parser.write(chunk)
                events, self._events = self._events, []
                for kind, value in events:
                    if kind == "file":
                        current = self._start(value)
                    elif kind == "data" and current is not None:
                        await _feed(*current, value)
                    elif kind == "end" and current is not None:
                        await _feed(*current, None)
                        results.append(await current[1])
                        current = None
            self._parser.finalize()
        finally:
            if current is not None:  # the client went away mid-file: the agent keeps nothing
                current[1].cancel()
                with contextlib.suppress(BaseException):
                    await current[1]
        return results

    def _start(
        self, headers: dict[bytes, bytes]
    ) -> tuple[asyncio.Queue[bytes | None], asyncio.Task[FileUploadResult]] | None:
        _, options = parse_options_header(headers.get(b"content-disposition", b""))
        raw = options.get(b"filename")
        if raw is None:
            return None  # a plain form field: not a file
        # aiohttp (the official client) percent-encodes the name: "data%2Fhello.txt"
        name = urllib.parse.unquote(raw.decode("utf-8", errors="replace"), errors="strict")
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_QUEUE_CHUNKS)

        async def content() -> AsyncIterator[bytes]:
            while (item := await chunks.get()) is not None:
                yield item

        task = asyncio.create_task(
            self._manager.session_files.upload(self._target, self._ref, name, content())
        )
        return chunks, task


async def _feed(
    chunks: asyncio.Queue[bytes | None], task: asyncio.Task[FileUploadResult], item: bytes | None
) -> None:
    """Hand a chunk to the upload; an upload that ended early (refused) raises here."""
    put = asyncio.ensure_future(chunks.put(item))
    await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        task.result()  # its error (a refusal); else it ended without reading: a bug
        raise RuntimeError("the upload to the agent ended before its file did")


# -- download -------------------------------------------------------------------------------


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequest(
            "the body is not a JSON document", field="body", expected="a JSON object"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body is not a JSON object", field="body", received=body)
    return body


@router.api_route("/session/{ref}/download", methods=["GET", "POST"])
async def download(
    ref: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> StreamingResponse:
    target = await manager.session_files.target(identity, ref)
    body = await _json_body(request)
    files = body.get("files", request.query_params.getlist("files"))
    if (
        not isinstance(files, list)
        or not files
        or not all(isinstance(f, str) for f in files)
        or len(files) > MAX_DOWNLOAD_FILES
    ):
        raise InvalidRequest(
            f"files: expected a list of 1 to {MAX_DOWNLOAD_FILES} paths",
            field="files",
            expected=f"a list of 1 to {MAX_DOWNLOAD_FILES} paths in /home/work",
            received=files,
        )
    # Every path is opened (checked by its agent) before the answer starts, so a missing
    # one is a 404, not a cut stream.
    stack = contextlib.AsyncExitStack()
    try:
        streams = [
            await stack.enter_async_context(manager.session_files.download(target, ref, path))
            for path in files
        ]
    except BaseException:
        await stack.aclose()
        raise
    boundary = secrets.token_hex(16)

    async def body_parts() -> AsyncIterator[bytes]:
        async with stack:
            for path, stream in zip(files, streams, strict=True):
                name = path.rstrip("/").rsplit("/", 1)[-1] or "work"
                yield (
                    f"--{boundary}\r\nContent-Type: application/x-tar\r\n"
                    f"Content-Disposition: attachment; filename={json.dumps(name + '.tar')}"
                    "\r\n\r\n"
                ).encode()
                async for chunk in stream:
                    yield chunk
                yield b"\r\n"
            yield f"--{boundary}--\r\n".encode()

    return StreamingResponse(body_parts(), media_type=f"multipart/mixed; boundary={boundary}")


# -- list -----------------------------------------------------------------------------------


@router.get("/session/{ref}/files")
async def list_files(
    ref: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> JSONResponse:
    body = await _json_body(request)
    path = body.get("path", request.query_params.get("path", "/home/work"))
    if not isinstance(path, str):
        raise InvalidRequest("path: expected a path in /home/work", field="path", received=path)
    listing = await manager.session_files.list(identity, ref, path)
    entries = [entry.model_dump(mode="json") for entry in listing.files]
    return JSONResponse({"files": json.dumps(entries), "errors": "", "abspath": path})
