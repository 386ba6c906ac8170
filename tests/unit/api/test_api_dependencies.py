"""Every route dependency of the control plane runs on the event loop.

FastAPI runs a plain-function dependency in its thread pool: a thread hop (a queue put,
a worker's wake-up, the result handed back to the loop) on every request that names it,
for a look-up of microseconds.  The manager's dependencies are coroutines."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIRouter

from accelshare.api import (
    admin,
    agents,
    app_proxy,
    bai_events,
    compat,
    config_routes,
    console_support,
    execute,
    folders,
    images,
    internal,
    login,
    metrics_route,
    session_files,
    sessions,
    stream,
    stream_apps,
    unsupported,
)
from accelshare.api.gql import create_graphql_router

ROUTERS: tuple[APIRouter, ...] = (
    login.router,
    sessions.router,
    agents.router,
    internal.router,
    config_routes.router,
    admin.router,
    images.router,
    metrics_route.router,
    compat.router,
    folders.router,
    app_proxy.router,
    execute.router,
    session_files.router,
    bai_events.router,
    stream_apps.router,
    unsupported.router,
    stream.router,
    console_support.router,
    create_graphql_router(),
)


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


def test_no_route_dependency_runs_in_the_thread_pool() -> None:
    seen: set[str] = set()
    in_thread_pool: list[str] = []
    for router in ROUTERS:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            for dependency in _dependencies(route.dependant):
                call = dependency.call
                if call is None:
                    continue
                name = getattr(call, "__qualname__", repr(call))
                seen.add(name)
                if not (inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)):
                    in_thread_pool.append(f"{route.path}: {name}")
    assert "manager_dependency" in seen  # the walk reached the manager's dependency
    assert "current_identity" in seen
    assert in_thread_pool == []
