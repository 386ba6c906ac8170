"""Backend.AI routes accelshare does not have: a clear 501 instead of a bare 404/405.

Each answers ``501 application/problem+json`` of type ``not-supported``, naming the
feature and what to use instead (docs/compatibility.md lists every client command):

| Backend.AI route | feature | instead |
|---|---|---|
| ``/session/{ref}/commit``, ``/imagify`` | a session saved as an image | build images outside and register them (``accelshare admin image``) |
| ``/session/{ref}/complete`` | code completion | |
| ``/session/{ref}/interrupt`` | interrupting a run | close the ``run`` (its WebSocket) to end the run |
| ``/session/{ref}/start-service`` | services started on demand | declare the service; the session serves it |
| ``/session/{ref}/abusing-report``, ``/dependency-graph`` | abuse reports; the dependency graph | ``accelshare session info`` lists dependencies |
| ``/session/_/create-from-template``, ``/template/session...`` | session templates | ``session create`` with its options |
| ``/user-config/dotfiles...`` | dotfiles | |
| ``/services...`` | model serving (``backend.ai service``, ``model``) | |
| ``/logs/error...``, ``/logs/task...`` | server and task logs | the manager's log (docs/operations.md) |
| ``/image/import`` | image import | ``accelshare admin image`` |
| ``/auth/update-password...`` | a user's own password change | an admin sets it (``accelshare admin user update``) |
| ``/license`` | the license (``admin license show``) | none needed; ``backend.ai config`` shows the version |
| ``/resource/usage/...``, ``/resource/stats/...`` | usage reports (``admin resource usage-per-month/-period``) | ``GET /metrics``; ``ps`` / ``session info`` |
| ``/resource/recalculate-usage`` | recomputing occupied slots | nothing to recompute (kept with each allocation) |
| ``/resource/container-registries``, ``/config/docker-registries`` | registry settings | the image catalogue (``accelshare admin image add``) |
| ``/config/vfolder-types`` | folder types | |
| ``/manager/scheduler/operation`` | excluding agents from scheduling (``admin manager scheduler``) | ``admin manager freeze``; stopping the agent |
"""

from __future__ import annotations

from fastapi import APIRouter

from .auth import CurrentIdentity
from .compat import NotSupported

__all__ = ["router"]

router = APIRouter(tags=["backend.ai compatibility"], include_in_schema=False)

_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE"]

_SESSION_FEATURES = {
    "commit": (
        "session-commit",
        "a session cannot be saved as an image; build images outside and register them with `accelshare admin image`",
    ),
    "imagify": (
        "session-commit",
        "a session cannot be saved as an image; build images outside and register them with `accelshare admin image`",
    ),
    "complete": (
        "code-completion",
        "code completion is not supported; run code with the execute API's 'query' or 'batch' mode",
    ),
    "interrupt": (
        "interrupt",
        "runs cannot be interrupted separately; closing a run's WebSocket (Ctrl-C in `backend.ai run`) ends it",
    ),
    "start-service": (
        "start-service",
        "services are not started on demand: the session's own process serves each declared service",
    ),
    "abusing-report": ("abuse-report", "accelshare keeps no abuse reports"),
    "dependency-graph": (
        "dependency-graph",
        "no dependency graph; `accelshare session info` lists a session's dependencies",
    ),
    "create-from-template": (
        "session-template",
        "accelshare has no session templates; use `session create` with its options",
    ),
}


def _refuse(feature: str, detail: str) -> None:
    raise NotSupported(f"{detail} (docs/compatibility.md)", feature=feature)


def _session_route(action: str) -> None:
    feature, detail = _SESSION_FEATURES[action]

    async def refuse(ref: str, _identity: CurrentIdentity) -> None:
        _refuse(feature, detail)

    router.add_api_route(f"/session/{{ref}}/{action}", refuse, methods=_ANY)


for _action in _SESSION_FEATURES:
    _session_route(_action)


@router.api_route("/template/session", methods=_ANY)
@router.api_route("/template/session/{rest:path}", methods=_ANY)
async def session_templates(_identity: CurrentIdentity) -> None:
    _refuse(*_SESSION_FEATURES["create-from-template"])


@router.api_route("/user-config/dotfiles", methods=_ANY)
@router.api_route("/user-config/dotfiles/{rest:path}", methods=_ANY)
async def dotfiles(_identity: CurrentIdentity) -> None:
    _refuse("dotfiles", "accelshare keeps no dotfiles for sessions")


@router.api_route("/services", methods=_ANY)
@router.api_route("/services/{rest:path}", methods=_ANY)
async def services(_identity: CurrentIdentity) -> None:
    _refuse("model-serving", "accelshare has no model serving (`backend.ai service`, `model`)")


@router.api_route("/logs/{rest:path}", methods=_ANY)
async def logs(_identity: CurrentIdentity) -> None:
    _refuse(
        "server-logs",
        "server and task logs are not served by the API; read the manager's log"
        " (docs/operations.md)",
    )


@router.api_route("/auth/update-password", methods=_ANY)
@router.api_route("/auth/update-password-no-auth", methods=_ANY)
async def update_password(_identity: CurrentIdentity) -> None:
    _refuse(
        "update-password",
        "users do not change their password through the API here; an admin sets it:"
        " `accelshare admin user update EMAIL --password ...`",
    )


@router.api_route("/image/import", methods=_ANY)
async def image_import(_identity: CurrentIdentity) -> None:
    _refuse("image-import", "images are not imported through the API; use `accelshare admin image`")


@router.api_route("/license", methods=_ANY)
async def license_info(_identity: CurrentIdentity) -> None:
    _refuse(
        "license",
        "accelshare has no license to show: it is open source and every feature is on;"
        " `backend.ai config` shows the manager's version",
    )


@router.api_route("/resource/usage/{rest:path}", methods=_ANY)
@router.api_route("/resource/stats/{rest:path}", methods=_ANY)
async def usage_statistics(_identity: CurrentIdentity) -> None:
    _refuse(
        "usage-statistics",
        "accelshare keeps no per-month or per-period usage reports; the live allocation"
        " is in the manager's Prometheus metrics (GET /metrics) and each session's"
        " occupied slots and status history in `backend.ai ps` / `session info`",
    )


@router.api_route("/resource/recalculate-usage", methods=_ANY)
async def recalculate_usage(_identity: CurrentIdentity) -> None:
    _refuse(
        "recalculate-usage",
        "there is no usage counter to recalculate: an agent's occupied slots are the sum"
        " of its kernels' allocations, written in the same transaction as each"
        " allocation and release",
    )


@router.api_route("/resource/container-registries", methods=_ANY)
@router.api_route("/config/docker-registries", methods=_ANY)
async def container_registries(_identity: CurrentIdentity) -> None:
    _refuse(
        "container-registries",
        "accelshare keeps no container registry settings: images are registered in its"
        " catalogue by reference (`accelshare admin image add REF`, docs/images.md)",
    )


@router.api_route("/manager/scheduler/operation", methods=_ANY)
async def scheduler_operation(_identity: CurrentIdentity) -> None:
    _refuse(
        "scheduler-operation",
        "agents cannot be excluded from scheduling one by one; freeze the whole manager"
        " (`backend.ai admin manager freeze`), or stop the agent with your service manager"
        " (its kernels' sessions end) and start it again afterwards",
    )
