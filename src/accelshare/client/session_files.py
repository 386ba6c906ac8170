"""A running session's working folder from the client: ``accelshare session upload``,
``download``, ``ls`` (the routes of :mod:`accelshare.api.session_files`, as Backend.AI's
client calls them).

Uploads stream each file from disk (a multipart body, one part per file, its name the
path under ``/home/work``); downloads stream the manager's ``multipart/mixed`` answer
(one tar per path) to temporary files and extract them with tarfile's ``data`` filter
(no absolute paths, no ``..``, no links leading out of the destination).
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
from python_multipart.multipart import MultipartParser, parse_options_header

from .errors import APIError
from .http import HttpCaller, problem_of

__all__ = ["SessionFilesAPI"]


def _path(ref: str, suffix: str) -> str:
    return f"/session/{quote(ref, safe='')}{suffix}"


class SessionFilesAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def upload(self, ref: str, files: Sequence[tuple[str, Path]]) -> None:
        """Put each local file at its path under /home/work (``(remote, local)`` pairs)."""
        opened: list[IO[bytes]] = []
        try:
            parts: list[tuple[str, tuple[str, IO[bytes], str]]] = []
            for remote, local in files:
                handle: IO[bytes] = open(local, "rb")  # noqa: SIM115 (closed below)
                opened.append(handle)
                # percent-encoded as aiohttp (the official client) sends it
                parts.append(("src", (quote(remote, safe=""), handle, "application/octet-stream")))
            try:
                response = await self._http.http.post(
                    _path(ref, "/upload"), files=parts, timeout=httpx.Timeout(30.0, write=None)
                )
            except httpx.TransportError as e:
                raise self._http._unreachable(e) from e
            if response.status_code >= 400:
                raise APIError(response.status_code, problem_of(response, response.content))
        finally:
            for handle in opened:
                handle.close()

    async def list_files(self, ref: str, path: str = "/home/work") -> list[dict[str, Any]]:
        """The entries of a folder: ``{filename, size, mode, mtime, ctime, atime}``."""
        answer = await self._http.request("GET", _path(ref, "/files"), params={"path": path})
        files = json.loads(answer["files"]) if isinstance(answer, dict) else []
        return [dict(f) for f in files]

    async def download(
        self,
        ref: str,
        paths: Sequence[str],
        dest: Path,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Download each path (a file or a folder) into ``dest``; the names extracted."""
        dest.mkdir(parents=True, exist_ok=True)
        names: list[str] = []
        try:
            async with self._http.http.stream(
                "POST",
                _path(ref, "/download"),
                json={"files": list(paths)},
                timeout=httpx.Timeout(30.0, read=None),
            ) as response:
                if response.status_code >= 400:
                    body = await response.aread()
                    raise APIError(response.status_code, problem_of(response, body))
                _, params = parse_options_header(response.headers.get("content-type", ""))
                boundary = params.get(b"boundary")
                if not boundary:
                    raise APIError(
                        502, {"detail": "the manager's answer is not multipart", "status": 502}
                    )
                tars = _TarParts(dest)
                parser = MultipartParser(boundary, tars.callbacks())  # type: ignore[arg-type]
                async for chunk in response.aiter_raw():
                    parser.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
                    names += tars.extract_finished()
                parser.finalize()
                names += tars.extract_finished()
        except httpx.TransportError as e:
            raise self._http._unreachable(e) from e
        return names


class _TarParts:
    """Each part of the answer into a temporary tar file, extracted once whole."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.current: IO[bytes] | None = None
        self.finished: list[str] = []

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_headers_finished": self._begin,
            "on_part_data": lambda data, start, end: self._write(data[start:end]),
            "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self.current = tempfile.NamedTemporaryFile(suffix=".tar", delete=False)  # noqa: SIM115

    def _write(self, data: bytes) -> None:
        if self.current is not None:
            self.current.write(data)

    def _end(self) -> None:
        if self.current is not None:
            self.current.close()
            self.finished.append(self.current.name)
            self.current = None

    def extract_finished(self) -> list[str]:
        names: list[str] = []
        for name in self.finished:
            try:
                with tarfile.open(name) as tar:
                    tar.extractall(self.dest, filter="data")
                    names += tar.getnames()
            finally:
                os.unlink(name)
        self.finished.clear()
        return names
