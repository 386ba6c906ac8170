"""The manager's endpoints for agents (``accelshare.protocol``), cluster secret only.

``POST /internal/agents/heartbeat`` ``Heartbeat`` -> ``HeartbeatAck``;
``POST /internal/agents/events`` ``KernelEventBatch`` -> 204.  The secret header
(``X-Accelshare-Cluster-Secret``) is compared in constant time; a wrong or missing one
is a 401 problem (``reason: cluster-secret-mismatch``).  These routes take no user
credentials: an agent is not a user.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from accelshare.manager.registry import UnknownScalingGroup
from accelshare.protocol import CLUSTER_SECRET_HEADER, Heartbeat, HeartbeatAck, KernelEventBatch

from .deps import ManagerDep
from .problems import InvalidAPIParameters, Unauthorized

__all__ = ["router"]


async def require_cluster_secret(request: Request, manager: ManagerDep) -> None:
    sent = request.headers.get(CLUSTER_SECRET_HEADER, "")
    if not hmac.compare_digest(sent.encode(), manager.cluster_secret.encode()):
        raise Unauthorized(
            f"Agents must send the cluster secret in {CLUSTER_SECRET_HEADER}"
            " (manager.toml [manager] cluster-secret or $ACCELSHARE_CLUSTER_SECRET)",
            reason="cluster-secret-mismatch" if sent else "missing-cluster-secret",
        )


router = APIRouter(
    prefix="/internal/agents",
    tags=["internal"],
    dependencies=[Depends(require_cluster_secret)],
)


@router.post("/heartbeat")
async def heartbeat(body: Heartbeat, manager: ManagerDep) -> HeartbeatAck:
    try:
        return await manager.registry.heartbeat(body)
    except UnknownScalingGroup as e:
        raise InvalidAPIParameters(
            str(e), field="scaling_group", expected="an existing scaling group", received=e.name
        ) from None


@router.post("/events", status_code=204)
async def events(body: KernelEventBatch, manager: ManagerDep) -> Response:
    await manager.registry.apply_events(body)
    return Response(status_code=204)


SecretDep = Annotated[None, Depends(require_cluster_secret)]
