"""Shared FastAPI dependencies of the control-plane routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from accelshare.manager.runtime import Manager

from .auth import Identity, current_identity
from .problems import ServiceUnavailable

__all__ = [
    "UNFROZEN",
    "ManagerDep",
    "ScalingGroupParam",
    "get_manager",
    "manager_dependency",
    "refuse_while_frozen",
]


def get_manager(request: Request) -> Manager:
    manager = getattr(request.app.state, "manager", None)
    if not isinstance(manager, Manager):
        raise ServiceUnavailable("The control plane is not running in this application")
    return manager


async def manager_dependency(request: Request) -> Manager:
    """:func:`get_manager` as a route dependency.  A coroutine: FastAPI runs a plain
    function dependency in its thread pool (a thread hop, its locks and wake-ups, on
    every request), a coroutine on the event loop at once."""
    return get_manager(request)


ManagerDep = Annotated[Manager, Depends(manager_dependency)]


async def refuse_while_frozen(
    identity: Annotated[Identity, Depends(current_identity)], manager: ManagerDep
) -> None:
    """Route dependency: a 503 ``server-frozen`` problem while the manager is frozen for
    maintenance (:mod:`accelshare.manager.maintenance`), Backend.AI's
    ``server_status_required(ALL_ALLOWED)``.  The caller is authenticated first (a
    request without valid credentials still gets its 401); the route's handler does
    not run, so nothing changes."""
    del identity  # only its check matters here
    await manager.maintenance.refuse_if_frozen()


UNFROZEN = Depends(refuse_while_frozen)
"""``dependencies=[UNFROZEN]`` on a route that changes what the manager records (a
folder, a user, an image...): refused while frozen.  The list of such routes is in
docs/manager.md (*Manager status*)."""

ScalingGroupParam = Annotated[str | None, Query(alias="sgroup")]
"""A route's optional scaling group, ``?sgroup=`` on the wire (Backend.AI's name)."""
