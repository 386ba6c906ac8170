"""The SDK's entry point: :class:`AccelshareClient` (async).

::

    from accelshare.client import AccelshareClient

    async with AccelshareClient.from_env() as client:        # ACCELSHARE_* / client.env
        created = await client.sessions.create(
            "python", resources={"cpu": "1", "mem": "1g", "cuda.shares": "0.2"}
        )
        print(created.session_id, created.status)
        amap = await client.agents.alloc_map("i-dev-01")
        answer = await client.query(
            "query ($id: String!) { agent(agent_id: $id) { gpu_alloc_map } }", {"id": "i-dev-01"}
        )

Every request is signed with the keypair (:class:`~accelshare.client.auth.KeypairAuth`).
Errors: :class:`~accelshare.client.errors.APIError` (the server's problem details),
:class:`~accelshare.client.errors.GraphQLError`,
:class:`~accelshare.client.errors.ConnectionFailed`.  Tests pass ``transport=``
(e.g. ``httpx.ASGITransport(app)``) to talk to an app without a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from .admin import AdminAPI
from .agents import AgentsAPI, ConfigAPI
from .auth import KeypairAuth
from .config import ClientConfig, load_client_config
from .errors import GraphQLError
from .folders import FoldersAPI
from .http import HttpCaller
from .images import ImagesAPI
from .session_files import SessionFilesAPI
from .sessions import SessionsAPI

__all__ = ["AccelshareClient"]


class AccelshareClient:
    def __init__(
        self,
        config: ClientConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float | None = None,
        storage_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client_config = config
        self._http = httpx.AsyncClient(
            base_url=config.endpoint,
            auth=KeypairAuth(config.access_key, config.secret_key),
            transport=transport,
            timeout=timeout_s if timeout_s is not None else config.timeout_s,
            headers={"Accept": "application/json"},
        )
        caller = HttpCaller(self._http, config.endpoint)
        self._caller = caller
        self.sessions = SessionsAPI(caller)
        self.session_files = SessionFilesAPI(caller)
        self.agents = AgentsAPI(caller)
        self.config = ConfigAPI(caller)
        self.admin = AdminAPI(caller)
        self.images = ImagesAPI(caller)
        self.folders = FoldersAPI(caller, storage_transport=storage_transport)

    @classmethod
    def from_env(
        cls,
        *,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        config_file: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> Self:
        """Configuration from arguments, ``ACCELSHARE_*`` / ``BACKEND_*`` or a file."""
        config = load_client_config(
            endpoint=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            config_file=config_file,
        )
        return cls(config, transport=transport)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- small calls -----------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """``GET /health`` (no credentials needed): ``{"status": "ok", "database": ...}``."""
        return dict(await self._caller.request("GET", "/health"))

    async def whoami(self) -> dict[str, Any]:
        """The caller: user id, email, role, domain, access key."""
        return dict(await self._caller.request("GET", "/whoami"))

    async def query(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run a GraphQL query at ``/admin/gql``; returns ``data``.

        ``errors`` in the answer raise :class:`GraphQLError` (which keeps the whole answer).
        """
        body: dict[str, Any] = {"query": query}
        if variables:
            body["variables"] = dict(variables)
        result = await self._caller.request("POST", "/admin/gql", json_body=body)
        if not isinstance(result, dict):
            raise GraphQLError({"errors": [{"message": f"not a GraphQL answer: {result!r}"}]})
        if result.get("errors"):
            raise GraphQLError(result)
        return dict(result.get("data") or {})
