"""The manager's client for the agent RPC (``accelshare.protocol``).

One ``httpx.AsyncClient`` for every agent; the transport is injectable so tests route
requests to in-process hollow agents (``accelshare_testkit.hollow_agent``) without a
network.  Every request carries the cluster secret.  Failures raise
:class:`AgentRPCError` with a message naming the agent and what went wrong — the
message ends up in the session's ``status_info``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from pydantic import ValidationError

from accelshare.protocol import (
    CLUSTER_SECRET_HEADER,
    CreateKernelRequest,
    ExecuteRequest,
    ExecuteResult,
    FileList,
    FileUploadResult,
    KernelList,
    KernelReport,
    KernelReports,
    NodeStats,
)

__all__ = ["AgentClient", "AgentRPCError"]


class AgentRPCError(Exception):
    """An agent could not be reached or refused the request."""

    def __init__(self, agent_url: str, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.agent_url = agent_url
        self.status_code = status_code

    @property
    def is_refusal(self) -> bool:
        """The agent answered (4xx/5xx), as opposed to not being reachable."""
        return self.status_code is not None

    @property
    def is_unsupported(self) -> bool:
        """The agent has no such route (404, or 405 where another method matches)."""
        return self.status_code in (404, 405)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "msg", "message", "reason", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    return json.dumps(body)[:300]


POOL_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=256)
"""Connections to agents: above the binder's agents in flight (``MAX_CONCURRENT_AGENTS``)
plus destroys and map reads, and kept alive for as many (httpx's default pool of 100,
20 kept, would queue the binds of a large pass and reconnect most of them)."""


class AgentClient:
    def __init__(
        self,
        cluster_secret: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.cluster_secret = cluster_secret  # also sent by the terminal relay (WebSocket)
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            headers={CLUSTER_SECRET_HEADER: cluster_secret},
            limits=POOL_LIMITS,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _request(
        self, method: str, base_url: str, path: str, **kwargs: Any
    ) -> httpx.Response:
        url = base_url.rstrip("/") + path
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            raise AgentRPCError(
                base_url, f"cannot reach the agent at {base_url}: {type(e).__name__}: {e}"
            ) from e
        if response.status_code >= 400:
            raise AgentRPCError(
                base_url,
                f"the agent refused {method} {path} ({response.status_code}): {_detail(response)}",
                status_code=response.status_code,
            )
        return response

    @staticmethod
    def _parse(base_url: str, model: type[Any], response: httpx.Response) -> Any:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as e:
            raise AgentRPCError(base_url, f"the agent sent an unexpected answer: {e}") from e

    async def create_kernel(self, base_url: str, request: CreateKernelRequest) -> KernelReport:
        response = await self._request(
            "POST",
            base_url,
            "/v1/kernels",
            content=request.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        report: KernelReport = self._parse(base_url, KernelReport, response)
        return report

    async def create_kernels(
        self, base_url: str, requests: list[CreateKernelRequest]
    ) -> list[KernelReport]:
        """``POST /v1/kernels/batch``: one report per request, in order.  An agent
        without the route (older than the batch) answers 404 or 405: see
        :meth:`AgentRPCError.is_unsupported`."""
        body = b"[" + b",".join(r.model_dump_json().encode() for r in requests) + b"]"
        response = await self._request(
            "POST",
            base_url,
            "/v1/kernels/batch",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            reports = KernelReports.validate_json(response.content)
        except ValidationError as e:
            raise AgentRPCError(base_url, f"the agent sent an unexpected answer: {e}") from e
        if len(reports) != len(requests) or any(
            report.kernel_id != request.kernel_id
            for report, request in zip(reports, requests, strict=True)
        ):
            raise AgentRPCError(
                base_url, "the agent's batch answer does not match its requests one by one"
            )
        return reports

    async def destroy_kernel(self, base_url: str, kernel_id: str) -> KernelReport:
        response = await self._request("DELETE", base_url, f"/v1/kernels/{kernel_id}")
        report: KernelReport = self._parse(base_url, KernelReport, response)
        return report

    async def list_kernels(self, base_url: str) -> KernelList:
        response = await self._request("GET", base_url, "/v1/kernels")
        kernels: KernelList = self._parse(base_url, KernelList, response)
        return kernels

    async def execute(
        self, base_url: str, kernel_id: str, request: ExecuteRequest
    ) -> ExecuteResult:
        """One step of a run in the kernel (waits up to the request's flushTimeout)."""
        response = await self._request(
            "POST",
            base_url,
            f"/v1/kernels/{kernel_id}/execute",
            content=request.model_dump_json(exclude_none=True),
            headers={"content-type": "application/json"},
            timeout=request.flushTimeout + 30.0,
        )
        result: ExecuteResult = self._parse(base_url, ExecuteResult, response)
        return result

    async def cancel_run(self, base_url: str, kernel_id: str, run_id: str) -> None:
        await self._request("DELETE", base_url, f"/v1/kernels/{kernel_id}/execute/{run_id}")

    async def kernel_logs(self, base_url: str, kernel_id: str) -> str:
        response = await self._request("GET", base_url, f"/v1/kernels/{kernel_id}/logs")
        return response.text

    async def alloc_map(self, base_url: str, *, compat: bool = False) -> dict[str, Any]:
        params = {"form": "compat"} if compat else None
        response = await self._request("GET", base_url, "/v1/alloc-map", params=params)
        try:
            body = response.json()
        except json.JSONDecodeError as e:
            raise AgentRPCError(base_url, f"the agent sent invalid JSON: {e}") from e
        if not isinstance(body, dict):
            raise AgentRPCError(base_url, "the agent sent an alloc map that is not an object")
        return body

    async def node_stats(self, base_url: str) -> dict[str, Any]:
        """The agent's ``GET /v1/stats/node`` (:class:`~accelshare.protocol.NodeStats`
        as JSON: per-device utilisation, memory, power, temperature from the plugins)."""
        response = await self._request("GET", base_url, "/v1/stats/node")
        stats: NodeStats = self._parse(base_url, NodeStats, response)
        return stats.model_dump(mode="json")

    # -- a kernel's working folder (protocol/files.py) ------------------------------------
    async def put_kernel_file(
        self, base_url: str, kernel_id: str, path: str, content: AsyncIterator[bytes]
    ) -> FileUploadResult:
        """Stream one file into the kernel's working folder (``path`` relative to it)."""
        response = await self._request(
            "PUT",
            base_url,
            f"/v1/kernels/{kernel_id}/files",
            params={"path": path},
            content=content,
            headers={"content-type": "application/octet-stream"},
            timeout=httpx.Timeout(None, connect=5.0),  # as long as the client sends
        )
        result: FileUploadResult = self._parse(base_url, FileUploadResult, response)
        return result

    async def list_kernel_files(self, base_url: str, kernel_id: str, path: str) -> FileList:
        response = await self._request(
            "GET", base_url, f"/v1/kernels/{kernel_id}/files/list", params={"path": path}
        )
        listing: FileList = self._parse(base_url, FileList, response)
        return listing

    @asynccontextmanager
    async def kernel_files_tar(
        self, base_url: str, kernel_id: str, path: str
    ) -> AsyncIterator[httpx.Response]:
        """A tar of the file or folder ``path``, as a streamed response (its status
        checked: ``AgentRPCError`` before the first byte)."""
        url = base_url.rstrip("/") + f"/v1/kernels/{kernel_id}/files"
        try:
            async with self._client.stream(
                "GET",
                url,
                params={"path": path},
                timeout=httpx.Timeout(None, connect=5.0),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise AgentRPCError(
                        base_url,
                        f"the agent refused GET /v1/kernels/{kernel_id}/files"
                        f" ({response.status_code}): {_detail(response)}",
                        status_code=response.status_code,
                    )
                yield response
        except httpx.HTTPError as e:
            raise AgentRPCError(
                base_url, f"cannot reach the agent at {base_url}: {type(e).__name__}: {e}"
            ) from e
