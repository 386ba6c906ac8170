"""Shared FastAPI dependencies of the control-plane routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from accelshare.manager.runtime import Manager

from .problems import ServiceUnavailable

__all__ = ["ManagerDep", "ScalingGroupParam", "get_manager", "manager_dependency"]


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

ScalingGroupParam = Annotated[str | None, Query(alias="sgroup")]
"""A route's optional scaling group, ``?sgroup=`` on the wire (Backend.AI's name)."""
