"""Slot types, slot UI metadata and the configuration tree.

| route | auth | answer |
|---|---|---|
| ``GET /config/resource-slots`` | any | ``{slot: type}``: the known set (``cpu: count``, ``mem: bytes``, ...) |
| ``GET /config/resource-slots/details?sgroup=`` | any | ``{slot: {slot_name, human_readable_name, description, display_unit, number_format, display_icon}}`` from the agents' plugins (of one scaling group when given) |
| ``GET /admin/etcd?key=K`` | superadmin | ``{"key": K, "value": "..." or null}`` |
| ``GET /admin/etcd?prefix=P`` | superadmin | ``{"prefix": P, "tree": {...}}`` |
| ``PUT /admin/etcd`` | superadmin | body ``{"key", "value"}`` or ``{"prefix", "tree", "replace"}`` -> ``{"result": "ok"}`` |
| ``DELETE /admin/etcd?key=K`` / ``?prefix=P`` | superadmin | ``{"result": "ok"}`` |
| ``POST /config/get`` | superadmin | Backend.AI's: body ``{"key", "prefix": false}`` -> ``{"result": value or tree or null}`` (global scope) |
| ``POST /config/set`` | superadmin | Backend.AI's: body ``{"key", "value"}`` (a string, or an object written as a tree under ``key``) -> ``{"result": "ok"}`` |
| ``POST /config/delete`` | superadmin | Backend.AI's: body ``{"key", "prefix": false}`` -> ``{"result": "ok"}`` |

``scope`` (``global`` default for writes, ``merged`` default for reads, ``sgroup``,
``node``) with ``sgroup=`` / ``node=`` names select the config-store scope, like
``accelshare mgr etcd``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from accelshare.config import ConfigScopes, ConfigStore, ConfigStoreError, InvalidConfigInput
from accelshare.manager.agents import slot_details
from accelshare.manager.enums import VFolderOwnershipType

from .auth import CurrentIdentity, SuperadminIdentity
from .deps import ManagerDep, ScalingGroupParam
from .problems import InvalidAPIParameters, ServiceUnavailable

__all__ = ["router"]

router = APIRouter(tags=["config"])


@router.get("/config/vfolder-types")
async def vfolder_types(_identity: CurrentIdentity) -> list[str]:
    """Backend.AI's folder types (``backend.ai admin resource vfolder-types``): user
    folders and project (group) folders (docs/folders.md)."""
    return [t.value for t in VFolderOwnershipType]


@router.get("/config/resource-slots")
async def resource_slots(_identity: CurrentIdentity, manager: ManagerDep) -> dict[str, str]:
    known = await manager.known_slots.load()
    return {slot: slot_type.value for slot, slot_type in known.items()}


@router.get("/config/resource-slots/details")
async def resource_slot_details(
    _identity: CurrentIdentity, manager: ManagerDep, scaling_group: ScalingGroupParam = None
) -> dict[str, Any]:
    known = await manager.known_slots.load()
    agents = await manager.list_agents(scaling_group=scaling_group)
    return slot_details(agents, known)


def _scoped(
    store: ConfigStore,
    scope: str | None,
    scaling_group: str | None,
    node: str | None,
    *,
    read: bool,
) -> tuple[ConfigStore, ConfigScopes]:
    raw = scope or ("merged" if read else "global")
    try:
        chosen = ConfigScopes(raw)
    except ValueError:
        raise InvalidAPIParameters(
            f"Unknown scope {raw!r}",
            field="scope",
            expected="one of " + ", ".join(ConfigScopes),
            received=raw,
        ) from None
    if scaling_group or node:
        try:
            store = store.scoped(scaling_group=scaling_group, node_id=node)
        except InvalidConfigInput as e:  # e.g. node="a/b" (was a 500; docs/reliability.md)
            field = "node" if str(e).startswith("invalid node id") else "sgroup"
            raise InvalidAPIParameters(
                str(e), field=field, expected=e.expected or None, received=e.received
            ) from None
    return store, chosen


def _one_of(key: str | None, prefix: str | None) -> None:
    if (key is None) == (prefix is None):
        raise InvalidAPIParameters(
            "Give exactly one of key and prefix",
            field="key",
            expected="key=... or prefix=...",
            received={"key": key, "prefix": prefix},
        )


def _config_problem(e: ConfigStoreError) -> Exception:
    if isinstance(e, InvalidConfigInput):
        return InvalidAPIParameters(
            str(e), field="key", expected=e.expected or None, received=e.received
        )
    return ServiceUnavailable(f"The configuration store failed: {e}")


@router.get("/admin/etcd")
async def get_config(
    _identity: SuperadminIdentity,
    manager: ManagerDep,
    key: str | None = None,
    prefix: str | None = None,
    scope: str | None = None,
    scaling_group: ScalingGroupParam = None,
    node: str | None = None,
) -> dict[str, Any]:
    _one_of(key, prefix)
    store, chosen = _scoped(manager.store, scope, scaling_group, node, read=True)
    try:
        if key is not None:
            return {"key": key, "value": await store.get(key, scope=chosen)}
        assert prefix is not None
        return {"prefix": prefix, "tree": await store.get_prefix(prefix, scope=chosen)}
    except ConfigStoreError as e:
        raise _config_problem(e) from None


class PutConfigBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str | None = None
    value: str | None = None
    prefix: str | None = None
    tree: dict[str, Any] | None = None
    replace: bool = False
    scope: str | None = None
    scaling_group: str | None = Field(default=None, alias="sgroup")
    node: str | None = None


@router.put("/admin/etcd")
async def put_config(
    body: PutConfigBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    _one_of(body.key, body.prefix)
    store, chosen = _scoped(manager.store, body.scope, body.scaling_group, body.node, read=False)
    try:
        if body.key is not None:
            if body.value is None:
                raise InvalidAPIParameters(
                    "A value is needed with key", field="value", expected="a string", received=None
                )
            await store.put(body.key, body.value, scope=chosen)
        else:
            assert body.prefix is not None
            if body.tree is None:
                raise InvalidAPIParameters(
                    "A tree is needed with prefix",
                    field="tree",
                    expected="an object",
                    received=None,
                )
            await store.put_prefix(body.prefix, body.tree, scope=chosen, replace=body.replace)
    except ConfigStoreError as e:
        raise _config_problem(e) from None
    return {"result": "ok"}


@router.delete("/admin/etcd")
async def delete_config(
    _identity: SuperadminIdentity,
    manager: ManagerDep,
    key: str | None = None,
    prefix: str | None = None,
    scope: str | None = None,
    scaling_group: ScalingGroupParam = None,
    node: str | None = None,
) -> dict[str, str]:
    _one_of(key, prefix)
    store, chosen = _scoped(manager.store, scope, scaling_group, node, read=False)
    try:
        if key is not None:
            await store.delete(key, scope=chosen)
        else:
            assert prefix is not None
            await store.delete_prefix(prefix, scope=chosen)
    except ConfigStoreError as e:
        raise _config_problem(e) from None
    return {"result": "ok"}


# -- Backend.AI's etcd routes (`backend.ai admin etcd get/set/delete`) ---------------------
class BackendAIConfigKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    prefix: bool = False


class BackendAIConfigSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    # the client sends VALUE through json.loads: "1" arrives as 1, "true" as true
    value: str | bool | int | float | dict[str, Any]


@router.post("/config/get")
async def bai_get_config(
    body: BackendAIConfigKey, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    """Backend.AI's ``POST /config/get``: ``{"result": value}`` (``prefix``: the tree
    under ``key``); the global scope merged with nothing else, as Backend.AI's etcd."""
    try:
        if body.prefix:
            return {"result": await manager.store.get_prefix(body.key, scope=ConfigScopes.GLOBAL)}
        return {"result": await manager.store.get(body.key, scope=ConfigScopes.GLOBAL)}
    except ConfigStoreError as e:
        raise _config_problem(e) from None


@router.post("/config/set")
async def bai_set_config(
    body: BackendAIConfigSet, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    """Backend.AI's ``POST /config/set``: a string value is one key (a number or a
    boolean: its JSON text), an object a tree written under ``key`` (merged into what
    is there)."""
    try:
        if isinstance(body.value, dict):
            await manager.store.put_prefix(body.key, body.value)
        elif isinstance(body.value, str):
            await manager.store.put(body.key, body.value)
        else:  # a JSON scalar, kept as its JSON text (1, 1.5, true)
            await manager.store.put(body.key, json.dumps(body.value))
    except ConfigStoreError as e:
        raise _config_problem(e) from None
    return {"result": "ok"}


@router.post("/config/delete")
async def bai_delete_config(
    body: BackendAIConfigKey, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    """Backend.AI's ``POST /config/delete``: the key, or (``prefix``) its whole tree."""
    try:
        if body.prefix:
            await manager.store.delete_prefix(body.key)
        else:
            await manager.store.delete(body.key)
    except ConfigStoreError as e:
        raise _config_problem(e) from None
    return {"result": "ok"}
