"""``httpx.Auth`` that signs every request with the Backend.AI-compatible scheme."""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import UTC, datetime

import httpx

from accelshare.api.signing import API_VERSION, sign_request

__all__ = ["KeypairAuth"]


class KeypairAuth(httpx.Auth):
    def __init__(
        self,
        access_key: str,
        secret_key: str,
        *,
        api_version: str = API_VERSION,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._access_key = access_key
        self._secret_key = secret_key
        self._api_version = api_version
        self._clock = clock or (lambda: datetime.now(UTC))

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        content_type = request.headers.get("content-type", "application/json")
        headers = sign_request(
            access_key=self._access_key,
            secret_key=self._secret_key,
            method=request.method,
            path_query=request.url.raw_path.decode("ascii"),
            host=request.headers["host"],
            now=self._clock(),
            content_type=content_type,
            api_version=self._api_version,
        )
        request.headers.update(headers)
        yield request
