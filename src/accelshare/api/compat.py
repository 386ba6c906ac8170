"""REST adapters for the official Backend.AI client (``backend.ai-client`` 25.5.x, issue #12).

accelshare already speaks Backend.AI's wire formats where its own API has the same
concept (request signing, ``GET /`` version negotiation, ``POST /session`` bodies,
``{"result": {"logs": ...}}``); this module holds only what is *different* for that
client, so that the native routes stay as the spec describes them:

* **create waits like Backend.AI.**  The client sends ``enqueueOnly: false,
  maxWaitSeconds: 0`` and prints "is created and ready" only for a RUNNING answer
  (Backend.AI's manager waits for the start).  accelshare answers after the first
  scheduling pass; for a request from that client (its ``User-Agent``) a session the
  pass *scheduled* is then awaited until RUNNING (or ended), at most
  :data:`START_WAIT_S`.  A session still PENDING is answered at once ("is enqueued for
  scheduling") instead of blocking the CLI until resources free up, as Backend.AI would.
* **``null`` means the default.**  The SDK sends ``environ: null``, ``dependencies:
  null``... for what its caller left out (:class:`CreateSessionRequest`).
* **resource options arrive as strings.**  ``--resource-opts
  allow_fractional_resource_fragmentation=false`` sends ``"false"``; boolean options are
  turned into booleans for every client (:func:`normalize_resource_opts`).
* ``GET /manager/announcement`` (asked before every admin command) and ``POST`` (a
  superadmin posts or removes it): the announcement, kept in the config store under
  ``manager/announcement``.
* ``GET / PUT /manager/status`` (``admin manager status / freeze / unfreeze``,
  superadmin): :mod:`accelshare.manager.maintenance`.
* ``GET /scaling-groups?group=`` (``admin scaling-group get-available``): every active
  scaling group, for a project the caller belongs to.
* what accelshare does not have (the agent watcher ``/resource/watcher...``) answers a
  501 problem that says so, instead of a bare 404 (storage folders, ``/folders``, are
  :mod:`.folders`).

See docs/compatibility.md for the command-by-command level.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, model_validator

import accelshare
from accelshare.config import ConfigScopes
from accelshare.manager.available_scaling_groups import available_scaling_groups as list_available
from accelshare.manager.runtime import Manager
from accelshare.sched.lifecycle import FINAL_STATUSES, SessionStatus

from .auth import CurrentIdentity, Identity, SuperadminIdentity
from .deps import ManagerDep
from .problems import InvalidAPIParameters, Problem
from .schemas.sessions import CreateSessionBody

__all__ = [
    "BACKENDAI_CLIENT_AGENT",
    "BOOLEAN_RESOURCE_OPTS",
    "START_WAIT_S",
    "CreateSessionRequest",
    "NotSupported",
    "drop_nulls",
    "is_backendai_client",
    "normalize_resource_opts",
    "router",
    "wait_like_backendai",
]

BACKENDAI_CLIENT_AGENT = "Backend.AI Client for Python"
"""The ``User-Agent`` prefix of the official SDK and CLI (``ai.backend.client``)."""

START_WAIT_S = 60.0
"""How long a create from the Backend.AI client waits for a scheduled session to run."""

_SETTLED = FINAL_STATUSES | {SessionStatus.RUNNING, SessionStatus.ERROR}

BOOLEAN_RESOURCE_OPTS = frozenset({"allow_fractional_resource_fragmentation"})
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})

router = APIRouter(tags=["backend.ai compatibility"])


class NotSupported(Problem):
    """501: a Backend.AI feature accelshare does not have (named in the detail)."""

    status = 501
    slug = "not-supported"
    title = "Not supported by accelshare"


def drop_nulls(raw: Any) -> Any:
    """``null`` means "not given" in a create body (top level and ``config``).

    Backend.AI's SDK sends ``environ: null`` and ``dependencies: null`` (and more) for
    arguments its caller left out; its manager then applies the defaults, so do we.

    >>> drop_nulls({"image": "python", "dependencies": None, "config": {"environ": None}})
    {'image': 'python', 'config': {}}
    """
    if not isinstance(raw, Mapping):
        return raw
    body = {key: value for key, value in raw.items() if value is not None}
    config = body.get("config")
    if isinstance(config, Mapping):
        body["config"] = {key: value for key, value in config.items() if value is not None}
    return body


class CreateSessionRequest(CreateSessionBody):
    """``POST /session``'s body: :class:`CreateSessionBody` where ``null`` is a default."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        return drop_nulls(data)


def is_backendai_client(request: Request) -> bool:
    return request.headers.get("user-agent", "").startswith(BACKENDAI_CLIENT_AGENT)


def normalize_resource_opts(body: CreateSessionBody) -> CreateSessionBody:
    """Boolean resource options given as text (``"false"``) become booleans.

    >>> from accelshare.api.schemas.sessions import CreateSessionBody
    >>> body = CreateSessionBody.model_validate({"image": "x", "config": {"resource_opts":
    ...     {"allow_fractional_resource_fragmentation": "false"}}})
    >>> normalize_resource_opts(body).config.resource_opts
    {'allow_fractional_resource_fragmentation': False}
    """
    opts = dict(body.config.resource_opts)
    changed = False
    for key in BOOLEAN_RESOURCE_OPTS & opts.keys():
        value = opts[key]
        if isinstance(value, bool):
            continue
        text = str(value).strip().lower()
        if text not in _TRUE | _FALSE:
            raise InvalidAPIParameters(
                f"The resource option {key} must be true or false (received {value!r})",
                field=f"config.resource_opts.{key}",
                expected="true or false",
                received=value,
            )
        opts[key] = text in _TRUE
        changed = True
    if not changed:
        return body
    config = body.config.model_copy(update={"resource_opts": opts})
    return body.model_copy(update={"config": config})


async def wait_like_backendai(
    manager: Manager,
    identity: Identity,
    body: CreateSessionBody,
    answer: Mapping[str, Any],
    *,
    timeout_s: float = START_WAIT_S,
) -> dict[str, Any]:
    """The create answer once a scheduled session runs (see the module docstring).

    ``answer`` is the native create answer; the result has the same shape with the
    status of the moment.  Returns ``answer`` unchanged when the client asked for
    ``enqueueOnly`` or its own ``maxWaitSeconds``, or when the session is still PENDING.
    """
    result = dict(answer)
    if body.enqueue_only or body.max_wait_seconds > 0:
        return result
    status = SessionStatus(result["status"])
    if status is SessionStatus.PENDING or status in _SETTLED:
        return result
    session_id = uuid.UUID(str(result["sessionId"]))
    # one status query per change for every waiter (not one per waiter: StatusWatch)
    await manager.sessions.status_watch.wait_for(session_id, _is_settled, timeout_s)
    session = await manager.sessions.get(identity, str(session_id))
    result.update(status=session["status"], statusInfo=session["statusInfo"], session=session)
    return result


def _is_settled(status: SessionStatus) -> bool:
    return status in _SETTLED


MAX_ANNOUNCEMENT = 10_000  # characters
ANNOUNCEMENT_KEY = "manager/announcement"  # Backend.AI's etcd key, in the config store


@router.get("/manager/announcement")
async def announcement(_identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    """Backend.AI's announcement banner (any user): ``{"enabled", "message"}``."""
    message = await manager.store.get(ANNOUNCEMENT_KEY, scope=ConfigScopes.GLOBAL)
    return {"enabled": bool(message), "message": message or ""}


class AnnouncementBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool
    message: str | None = None


@router.post("/manager/announcement", status_code=204)
async def update_announcement(
    body: AnnouncementBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> None:
    """Post (``enabled: true`` with a ``message``) or remove (``enabled: false``) the
    announcement (superadmin; ``backend.ai admin announcement update/delete``)."""
    if not body.enabled:
        await manager.store.delete(ANNOUNCEMENT_KEY)
        return
    if not body.message or not body.message.strip():
        raise InvalidAPIParameters(
            "message: an enabled announcement needs a message",
            field="message",
            expected="a non-empty string",
            received=body.message,
        )
    if len(body.message) > MAX_ANNOUNCEMENT:
        raise InvalidAPIParameters(
            f"message: expected at most {MAX_ANNOUNCEMENT} characters,"
            f" received {len(body.message)}",
            field="message",
            expected=f"at most {MAX_ANNOUNCEMENT} characters",
            received=f"{len(body.message)} characters",
        )
    await manager.store.put(ANNOUNCEMENT_KEY, body.message)


class ManagerStatusBody(BaseModel):
    """``PUT /manager/status``: ``{"status": "frozen" | "running", "force_kill": bool}``."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["running", "frozen"]
    force_kill: bool = False


@router.get("/manager/status")
async def manager_status(
    request: Request, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    """Backend.AI's ``admin manager status``: running or frozen, and the sessions
    holding resources (what ``freeze --wait`` waits for).  Superadmin."""
    status = (await manager.maintenance.status()).value
    active = await manager.maintenance.active_sessions()
    node = {
        "id": socket.gethostname(),
        "num_proc": 1,
        "service_addr": f"{request.url.hostname}:{request.url.port or ''}".rstrip(":"),
        "heartbeat_timeout": manager.options.agent_timeout_s,
        "ssl_enabled": request.url.scheme == "https",
        "active_sessions": active,
        "status": status,
        "version": accelshare.__version__,
        "api_version": request.headers.get("X-BackendAI-Version", ""),
    }
    return {"nodes": [node], "status": status, "active_sessions": active}


@router.put("/manager/status", status_code=204)
async def set_manager_status(
    body: ManagerStatusBody, identity: SuperadminIdentity, manager: ManagerDep
) -> Response:
    """``freeze`` (``force_kill``: destroy every live session too) / ``unfreeze``;
    see :mod:`accelshare.manager.maintenance`.  Superadmin."""
    await manager.maintenance.set_status(identity, body.status, force_kill=body.force_kill)
    return Response(status_code=204)


@router.get("/scaling-groups")
async def available_scaling_groups(
    group: str, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    """Backend.AI's ``admin scaling-group get-available --group``: the scaling groups the
    project may use (:mod:`accelshare.manager.available_scaling_groups`)."""
    names = await list_available(manager.db, identity, group)
    return {"scaling_groups": [{"name": n} for n in names]}


_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@router.api_route("/resource/watcher", methods=_ANY_METHOD, include_in_schema=False)
@router.api_route("/resource/watcher/{rest:path}", methods=_ANY_METHOD, include_in_schema=False)
async def watcher(_identity: CurrentIdentity) -> None:
    """Backend.AI's agent watcher (``backend.ai admin agent watcher ...``)."""
    raise NotSupported(
        "accelshare has no agent watcher: start and stop agents with your service manager"
        " (`accelshare server agent`); see docs/compatibility.md",
        feature="agent-watcher",
    )
