"""Shared FastAPI dependencies of the control-plane routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from accelshare.manager.runtime import Manager

from .problems import ServiceUnavailable

__all__ = ["ManagerDep", "ScalingGroupParam", "get_manager"]


def get_manager(request: Request) -> Manager:
    manager = getattr(request.app.state, "manager", None)
    if not isinstance(manager, Manager):
        raise ServiceUnavailable("The control plane is not running in this application")
    return manager


ManagerDep = Annotated[Manager, Depends(get_manager)]

ScalingGroupParam = Annotated[str | None, Query(alias="sgroup")]
"""A route's optional scaling group, ``?sgroup=`` on the wire (Backend.AI's name)."""
