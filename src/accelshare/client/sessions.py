"""``client.sessions``: create, look up, list, destroy, logs, why-pending, events.

A session is named by its id or by its name (the caller's own sessions).  Resource
amounts are user input as the server parses it (``{"cpu": "1", "mem": "1g",
"cuda.shares": "0.2"}``); the server refuses unknown slots, negative amounts and
amounts off the quantum grid with a problem naming the field.  Before sending, each
amount is read by the same strict parser (:func:`accelshare.common.parse_amount`):
a boolean, ``"1_0"``, full-width digits or junk raise a ``SlotValueError`` (a
``ValueError``) naming the slot; a ``Decimal`` or ``float`` is sent as its exact text.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from urllib.parse import quote

from accelshare.common import (
    InvalidResourceSlotQuantity,
    SlotTypes,
    canonical_decimal,
    parse_amount,
)
from accelshare.sched.lifecycle import FINAL_STATUSES

from .http import HttpCaller
from .models import (
    CreatedSession,
    DestroyedSession,
    SessionEvent,
    SessionInfo,
    SessionPage,
    WhyPending,
)

__all__ = ["SessionsAPI"]

SessionType = Literal["interactive", "batch"]


def request_amounts(resources: Mapping[str, Any]) -> dict[str, str | int]:
    """The ``resources`` of a create body, each amount's syntax checked by the strict
    parser (the sign and the quantum are the server's to judge: its problem names them)
    and sent as written: text and ints as given, a ``Decimal`` or ``float`` as its exact
    decimal text.

    >>> request_amounts({"cpu": 1, "mem": "1g", "cuda.shares": 0.25})
    {'cpu': 1, 'mem': '1g', 'cuda.shares': '0.25'}
    """
    out: dict[str, str | int] = {}
    for slot, value in resources.items():
        kind = SlotTypes.BYTES if "mem" in slot else SlotTypes.COUNT
        with contextlib.suppress(InvalidResourceSlotQuantity):  # the server names it
            parse_amount(slot, value, kind)
        if isinstance(value, str | int):
            out[slot] = value
        else:  # a Decimal or a float (what else the parser accepts)
            out[slot] = canonical_decimal(
                Decimal(repr(value)) if isinstance(value, float) else value
            )
    return out


def _path(ref: str, suffix: str = "") -> str:
    return f"/session/{quote(ref, safe='')}{suffix}"


class SessionsAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def create(
        self,
        image: str,
        *,
        resources: Mapping[str, Any] | None = None,
        name: str | None = None,
        type: SessionType | None = None,
        priority: int | None = None,
        starts_at: datetime | str | None = None,
        resource_opts: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        startup_command: str | None = None,
        scaling_group: str | None = None,
        dependencies: Sequence[str] = (),
        enqueue_only: bool = False,
        max_wait_s: int = 0,
        service_ports: Mapping[str, int] | None = None,
        wait_for_agents: bool = False,
        mounts: Sequence[str] = (),
    ) -> CreatedSession:
        """Enqueue a session (``POST /session``).

        The answer comes after the scheduler's first verdict (so a PENDING session
        carries its reason), or with ``max_wait_s`` once the session is RUNNING or
        ended (at most that long); ``enqueue_only`` returns at once.
        ``service_ports``: ``{name: port}`` of HTTP app services the session offers
        (proxied at ``/session/{id}/apps/{name}/``).  ``wait_for_agents``: queue a
        session no agent of the scaling group could hold even when empty (refused
        otherwise) for agents yet to join.  ``mounts``: storage folders to mount
        (``name``, ``name:/path``, ``name:/path:ro``; docs/folders.md).
        """
        config: dict[str, Any] = {"resources": request_amounts(resources or {})}
        if mounts:
            config["mounts"] = list(mounts)
        if resource_opts:
            config["resource_opts"] = dict(resource_opts)
        if environ:
            config["environ"] = dict(environ)
        if scaling_group:
            config["scalingGroup"] = scaling_group
        if service_ports:
            config["service_ports"] = [
                {"name": n, "protocol": "http", "port": p} for n, p in service_ports.items()
            ]
        body: dict[str, Any] = {"image": image, "config": config}
        if name is not None:
            body["name"] = name
        if type is not None:
            body["type"] = type
        if priority is not None:
            body["priority"] = priority
        if starts_at is not None:
            body["starts_at"] = (
                starts_at.isoformat() if isinstance(starts_at, datetime) else starts_at
            )
        if startup_command is not None:
            body["startupCommand"] = startup_command
        if dependencies:
            body["dependencies"] = list(dependencies)
        if enqueue_only:
            body["enqueueOnly"] = True
        if max_wait_s:
            body["maxWaitSeconds"] = max_wait_s
        if wait_for_agents:
            body["waitForAgents"] = True
        return CreatedSession.model_validate(
            await self._http.request("POST", "/session", json_body=body)
        )

    async def get(self, ref: str) -> SessionInfo:
        return SessionInfo.model_validate(await self._http.request("GET", _path(ref)))

    async def list(
        self,
        status: str | Sequence[str] | None = None,
        *,
        access_key: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> SessionPage:
        """``status``: statuses (``"RUNNING,PENDING"`` or a list) or ``"all"``;
        default: every live session."""
        wanted = status if status is None or isinstance(status, str) else ",".join(status)
        params = {"status": wanted, "access_key": access_key, "limit": limit, "offset": offset}
        return SessionPage.model_validate(
            await self._http.request("GET", "/sessions", params=params)
        )

    async def destroy(self, ref: str, *, forced: bool = False) -> DestroyedSession:
        """PENDING -> CANCELLED; running -> TERMINATED once the agent confirms
        (``forced``: even if it does not)."""
        answer = await self._http.request(
            "DELETE", _path(ref), params={"forced": True} if forced else None
        )
        return DestroyedSession.model_validate(answer)

    async def logs(self, ref: str) -> str:
        answer = await self._http.request("GET", _path(ref, "/logs"))
        if isinstance(answer, dict):
            return str((answer.get("result") or {}).get("logs") or "")
        return str(answer or "")

    async def apps(self, ref: str) -> dict[str, Any]:
        """``{"sessionId", "apps": [{name, protocol, port, url}]}`` of a RUNNING session."""
        answer = await self._http.request("GET", _path(ref, "/apps"))
        return dict(answer) if isinstance(answer, dict) else {"apps": []}

    async def why(self, ref: str) -> WhyPending:
        return WhyPending.model_validate(await self._http.request("GET", _path(ref, "/why")))

    async def events(self, ref: str) -> AsyncGenerator[SessionEvent, None]:
        """Status changes (history first); ends when the session reaches a final status."""
        async with contextlib.aclosing(self._http.events(_path(ref, "/events"))) as stream:
            async for event in stream:
                if event.event == "status":
                    yield SessionEvent.model_validate(event.json())

    async def wait(
        self,
        ref: str,
        statuses: Collection[str] = ("RUNNING",),
        *,
        timeout_s: float = 60.0,
    ) -> SessionInfo:
        """Until the session is in one of ``statuses`` or final; returns it then.

        Follows the event stream; raises ``TimeoutError`` after ``timeout_s``.
        """
        targets = {str(s) for s in (*statuses, *FINAL_STATUSES)}
        deadline = time.monotonic() + timeout_s
        async with asyncio.timeout(timeout_s), contextlib.aclosing(self.events(ref)) as events:
            async for event in events:
                if event.status in targets:
                    break
        info = await self.get(ref)
        # The stream ends at a final status; a session moving on meanwhile is fine.
        while info.status not in targets and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            info = await self.get(ref)
        return info

    async def list_all(
        self, status: str | Sequence[str] | None = None, *, access_key: str | None = None
    ) -> builtins.list[SessionInfo]:
        """Every page of :meth:`list`."""
        items: builtins.list[SessionInfo] = []
        while True:
            page = await self.list(status, access_key=access_key, limit=1000, offset=len(items))
            items.extend(page.items)
            if not page.items or len(items) >= page.total:
                return items
