"""GraphQL at ``/admin/gql`` (strawberry; same authentication as REST; snake_case names).

Backend.AI's field names and shapes; slot maps are JSON *strings* (its ``JSONString``)::

    query ($agent_id: String!) {
      agent(agent_id: $agent_id) { id status available_slots occupied_slots gpu_alloc_map alloc_map }
    }
    -> {"data": {"agent": {"gpu_alloc_map": "{\\"...2d02\\": \\"0.80\\", \\"...2d01\\": \\"0.60\\"}", ...}}}

* ``agent(agent_id)``, ``agents(status, scaling_group)``, ``agent_list(limit, offset,
  status, scaling_group, filter, order) { items total_count }`` — superadmin;
* ``compute_session(id: UUID!)``,
  ``compute_session_list(limit, offset, status, access_key, filter, order) { items
  total_count }`` — the caller's visibility (user: own, admin: domain, superadmin: all);
* ``filter`` / ``order``: Backend.AI's expressions (``status == "RUNNING" & name ilike
  "%x%"``, ``"-created_at"``; :mod:`accelshare.manager.querylang`, fields in
  :mod:`accelshare.manager.list_specs`); a bad one is a GraphQL error naming the column;
* ``keypair(access_key)`` — the caller's own keypair (or one of its domain for an admin,
  any one for a superadmin);
* ``images(runtime, is_operation)``, ``image(reference)`` — the image catalogue (any
  user; docs/images.md);
* Backend.AI's admin surface (users, keypairs, domains, groups, scaling groups and their
  associations, keypair resource policies, image aliases, their mutations, and the admin
  mutations accelshare refuses with a readable error: registry rescans, quota scopes):
  :mod:`.gql_admin`;
* ``vfolder_list(limit, offset, group_id, filter, order)`` — the caller's folders (a
  superadmin: all); ``vfolder_own_list``, ``vfolder_invited_list``,
  ``vfolder_project_list`` (``limit, offset, filter, order``) — one kind of them each
  (:class:`~accelshare.manager.services.folders.crud.FolderScope`);
* ``storage_volume(id)``, ``storage_volume_list(limit, offset)`` — superadmin; the
  volumes of the storage proxies: :mod:`.storage_gql`;
* the root fields of Backend.AI features accelshare does not have (model serving,
  networks, customized images...) are refused at validation with what to use instead:
  :mod:`.gql_refused`.

Mutations (Backend.AI's):

* ``modify_compute_session(input: {id, name, priority, clientMutationId}) { item { name
  priority } clientMutationId }`` — the caller's visibility; ``priority`` (0..100) only
  while the session is PENDING, ``name`` as ``POST /session/{ref}/rename``;
* ``rescan_gpu_alloc_maps(agent_id) { task_id }`` — superadmin; the maps are live, so
  nothing runs and ``task_id`` is null;
* ``forget_image(reference, architecture)``, ``forget_image_by_id(image_id) { ok msg
  image }`` — superadmin; the image leaves the catalogue with its aliases (as ``DELETE
  /admin/images/{name}``).

While the manager is frozen for maintenance (:mod:`accelshare.manager.maintenance`), a
request whose operation is a mutation is refused as a whole, before anything runs, with
the 503 problem ``server-frozen`` that ``POST /session`` gets; queries go on.

The official Backend.AI client's queries work unchanged: the extra fields and arguments
it sends are described in :mod:`.compat_gql` (and docs/compatibility.md).

``gpu_alloc_map`` and ``alloc_map`` are read live from the agent (see
:mod:`accelshare.manager.agents`).  Errors come back as GraphQL ``errors`` with the
same message a REST problem would carry.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from decimal import Decimal
from typing import Annotated, Any

import strawberry
from fastapi import Depends, Request
from graphql import GraphQLError
from strawberry.fastapi import GraphQLRouter
from strawberry.schema.config import StrawberryConfig
from strawberry.types import ExecutionContext, Info
from strawberry.types.graphql import OperationType
from strawberry.utils.operation import get_operation_type

from accelshare.manager.agents import AgentRecord, gpu_alloc_map_string
from accelshare.manager.enums import AgentStatus, UserRole
from accelshare.manager.errors import ManagerError
from accelshare.manager.list_specs import IMAGES
from accelshare.manager.querylang.compile_py import predicate, sort_items
from accelshare.manager.runtime import Manager, StatsUnavailable
from accelshare.manager.services.folders.crud import FolderScope
from accelshare.sched.lifecycle import SessionStatus

from .auth import Identity, current_identity
from .compat_gql import (
    ContainerNode,
    DependencyNode,
    KeyPairNode,
    VirtualFolderList,
    VirtualFolderNode,
    containers_of,
    group_name,
    hardware_metadata,
    keypair_from_row,
    session_statuses,
    user_email,
)
from .deps import manager_dependency
from .gql_admin import AdminMutation, AdminQuery
from .gql_admin.common import check_page
from .gql_limits import GraphQLLimits, LimitExceeded, check_cost, parse_document
from .gql_refused import RefusedRootFields
from .problems import QueryTooComplex
from .storage_gql import StorageQuery

__all__ = ["create_graphql_router", "schema"]

log = logging.getLogger(__name__)

# Errors a caller causes (refused role, bad argument, unknown object): one log line per
# request; anything else is a bug, logged once with its traceback.
_EXPECTED_ERRORS = (PermissionError, ValueError, LookupError, ManagerError)
_page = check_page


def _context(info: Info) -> tuple[Manager, Identity]:
    ctx = info.context
    return ctx["manager"], ctx["identity"]


def _require_superadmin(identity: Identity) -> None:
    if not identity.is_superadmin:
        raise PermissionError(
            f"This needs the superadmin role; {identity.email} has {identity.role}"
        )


def _json(value: Any) -> str:
    return json.dumps(value)


@strawberry.type(name="Agent")
class AgentNode:
    id: str
    status: str
    status_changed: str | None
    region: str
    scaling_group: str
    addr: str
    architecture: str
    version: str
    schedulable: bool
    available_slots: str
    occupied_slots: str
    compute_plugins: str
    first_contact: str | None
    last_heartbeat: str | None
    lost_at: str | None
    hardware_metadata: str
    local_config: str
    _row: strawberry.Private[AgentRecord]
    _stats: strawberry.Private[list[dict[str, Any] | None]]

    @classmethod
    def from_row(cls, row: AgentRecord) -> AgentNode:
        return cls(
            id=row.id,
            status=row.status.value,
            status_changed=row.status_changed_at.isoformat() if row.status_changed_at else None,
            region=row.region,
            scaling_group=row.scaling_group,
            addr=row.address,
            architecture=row.architecture,
            version=row.version,
            schedulable=row.is_schedulable,
            available_slots=_json(row.available_slots.to_json()),
            occupied_slots=_json(row.occupied_slots.to_json()),
            compute_plugins=_json(row.compute_plugins or {}),
            first_contact=row.first_contact_at.isoformat() if row.first_contact_at else None,
            last_heartbeat=row.last_heartbeat_at.isoformat() if row.last_heartbeat_at else None,
            lost_at=row.lost_at.isoformat() if row.lost_at else None,
            hardware_metadata=hardware_metadata(row),
            local_config=_json(
                {
                    "agent": {
                        "id": row.id,
                        "region": row.region,
                        "scaling-group": row.scaling_group,
                        "rpc-listen-addr": row.address,
                    }
                }
            ),
            _row=row,
            _stats=[],
        )

    async def _live(self, info: Info) -> dict[str, Any] | None:
        """Backend.AI's ``live_stat`` from the agent's latest stats (null when there
        are none: the agent is not reachable or reports nothing), asked once per node."""
        if not self._stats:
            manager, _ = _context(info)
            try:
                stats = await manager.node_stats(self._row)
            except StatsUnavailable:
                self._stats.append(None)
            else:
                self._stats.append(live_stat(stats.get("metrics") or []))
        return self._stats[0]

    @strawberry.field
    async def live_stat(self, info: Info) -> str | None:
        """``{"node": {metric: {current, capacity, pct, unit_hint}}, "devices": {metric:
        {device: {...}}}}`` as a JSON string (Backend.AI's shape)."""
        live = await self._live(info)
        return _json(live) if live is not None else None

    @strawberry.field
    async def cpu_cur_pct(self, info: Info) -> float | None:
        """The node's CPU use in percent of all its cores (null when not measured)."""
        live = await self._live(info)
        metric = (live or {}).get("node", {}).get("cpu_util")
        return float(metric["pct"]) if metric and metric["pct"] is not None else None

    @strawberry.field
    async def mem_cur_bytes(self, info: Info) -> float | None:
        """The node's used memory in bytes (null when no plugin measures ``mem``)."""
        live = await self._live(info)
        metric = (live or {}).get("node", {}).get("mem")
        return float(metric["current"]) if metric else None

    @strawberry.field
    async def gpu_alloc_map(self, info: Info) -> str:
        """Live ``{device: "0.80"}`` of the accelerators, as a JSON string."""
        manager, _ = _context(info)
        answer = await manager.alloc_map(self._row, compat=True)
        return gpu_alloc_map_string(answer.get("alloc_map", {}))

    @strawberry.field
    async def alloc_map(self, info: Info) -> str:
        """Live full allocation map (every plugin, slot and device), as a JSON string."""
        manager, _ = _context(info)
        return _json(await manager.alloc_map(self._row, compat=False))


@strawberry.type
class AgentList:
    items: list[AgentNode]
    total_count: int


@strawberry.type(name="ComputeSession")
class ComputeSessionNode:
    id: str
    session_id: str
    name: str
    session_name: str
    type: str
    image: str
    architecture: str
    status: str
    status_info: str | None
    status_data: str
    status_changed: str | None
    result: str
    priority: int
    scaling_group: str
    agent: str | None
    agent_ids: list[str]
    access_key: str
    user_id: str
    group_id: str
    domain_name: str
    requested_slots: str
    occupied_slots: str
    resource_opts: str
    created_at: str | None
    scheduled_at: str | None
    starts_at: str | None
    terminated_at: str | None
    # Backend.AI's names and fields (its client's session field list).
    created_user_id: str
    occupying_slots: str
    startup_command: str | None
    tag: str | None
    registry: str | None
    cluster_template: str | None
    cluster_mode: str
    cluster_size: int
    service_ports: str
    mounts: list[str]
    vfolder_mounts: list[str]
    abusing_reports: list[str]
    idle_checks: str
    _raw: strawberry.Private[dict[str, Any]]

    @classmethod
    def from_json(cls, s: dict[str, Any]) -> ComputeSessionNode:
        return cls(
            id=s["sessionId"],
            session_id=s["sessionId"],
            name=s["sessionName"],
            session_name=s["sessionName"],
            type=s["type"],
            image=s["image"],
            architecture=s["architecture"],
            status=s["status"],
            status_info=s["statusInfo"],
            status_data=_json(s["statusData"]),
            status_changed=s["statusChangedAt"],
            result=s["result"],
            priority=s["priority"],
            scaling_group=s["scalingGroup"],
            agent=s["agentId"],
            agent_ids=[s["agentId"]] if s["agentId"] else [],
            access_key=s["accessKey"],
            user_id=s["userId"],
            group_id=s["groupId"],
            domain_name=s["domainName"],
            requested_slots=_json(s["requestedSlots"]),
            occupied_slots=_json(s["occupiedSlots"]),
            resource_opts=_json(s["resourceOpts"]),
            created_at=s["creationTime"],
            scheduled_at=s["scheduledAt"],
            starts_at=s["startsAt"],
            terminated_at=s["terminationTime"],
            created_user_id=s["userId"],
            occupying_slots=_json(s["occupiedSlots"]),
            startup_command=s["startupCommand"],
            tag=s.get("tag"),
            registry=None,
            cluster_template=None,
            cluster_mode="single-node",
            cluster_size=1,
            service_ports=json.dumps(s.get("servicePorts") or []),
            mounts=[str(m.get("name")) for m in s.get("mounts") or []],
            vfolder_mounts=[str(m.get("name")) for m in s.get("mounts") or []],
            abusing_reports=[],
            idle_checks="{}",
            _raw=s,
        )

    async def _full(self, info: Info) -> dict[str, Any]:
        """The session with its kernels (list items are fetched without them)."""
        if "kernels" in self._raw or "statusHistory" in self._raw:
            return self._raw
        manager, identity = _context(info)
        self._raw = await manager.sessions.get(identity, self.session_id)
        return self._raw

    @strawberry.field
    async def main_kernel_id(self, info: Info) -> str | None:
        kernels = (await self._full(info)).get("kernels") or []
        return str(kernels[0]["kernelId"]) if kernels else None

    @strawberry.field
    async def containers(self, info: Info) -> list[ContainerNode]:
        return containers_of(await self._full(info))

    @strawberry.field
    async def dependencies(self, info: Info) -> list[DependencyNode]:
        manager, identity = _context(info)
        nodes = []
        for dep in (await self._full(info)).get("dependencies") or []:
            try:
                other = await manager.sessions.get(identity, dep)
            except ManagerError:
                nodes.append(DependencyNode(id=dep, name=None, status=None))
            else:
                nodes.append(
                    DependencyNode(id=dep, name=other["sessionName"], status=other["status"])
                )
        return nodes

    @strawberry.field
    async def group_name(self, info: Info) -> str | None:
        manager, _ = _context(info)
        return await group_name(manager, self.group_id)

    @strawberry.field
    async def user_email(self, info: Info) -> str | None:
        manager, _ = _context(info)
        return await user_email(manager, self.user_id)

    @strawberry.field
    async def created_user_email(self, info: Info) -> str | None:
        manager, _ = _context(info)
        return await user_email(manager, self.user_id)


@strawberry.type
class ComputeSessionList:
    items: list[ComputeSessionNode]
    total_count: int


def live_stat(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Backend.AI's ``live_stat`` from accelshare's node metrics (``{name, device_id,
    value, capacity, unit}``): ``pct`` is ``value / capacity`` in percent (the value
    itself for a percentage without a capacity), amounts as strings.

    >>> live_stat([{"name": "cpu_util", "device_id": None, "value": "50", "capacity": "200",
    ...             "unit": "percent"}])["node"]["cpu_util"]["pct"]
    '25.00'
    """
    node: dict[str, Any] = {}
    devices: dict[str, dict[str, Any]] = {}
    for m in metrics:
        value = Decimal(str(m["value"]))
        capacity = Decimal(str(m["capacity"])) if m.get("capacity") is not None else None
        if capacity:
            pct: Decimal | None = value * 100 / capacity
        elif m.get("unit") in ("percent", "%", "pct"):
            pct = value
        else:
            pct = None
        entry = {
            "current": str(value),
            "capacity": str(capacity) if capacity is not None else None,
            "pct": f"{pct:.2f}" if pct is not None else None,
            "unit_hint": m.get("unit") or "count",
            "stats.max": None,
        }
        if m.get("device_id") is None:
            node[m["name"]] = entry
        else:
            devices.setdefault(m["name"], {})[str(m["device_id"])] = entry
    for name in node:  # the client's formatter looks the node's metrics up per device
        devices.setdefault(name, {})
    return {"node": node, "devices": devices}


def _agent_status(status: str | None) -> AgentStatus | None:
    if not status:
        return None
    try:
        return AgentStatus(status.upper())
    except ValueError:
        raise ValueError(
            f"Unknown agent status {status!r}: expected one of {', '.join(AgentStatus)}"
        ) from None


def image_registry(image: dict[str, Any]) -> str | None:
    """The registry a docker image is pulled from (the engine's rule: a first path part
    with a dot or a port, or ``localhost``, is a host; else Docker Hub); None for the
    process runtime's environments, which come from no registry.

    >>> image_registry({"runtime": "docker", "name": "cr.example.org/lablup/pytorch"})
    'cr.example.org'
    >>> image_registry({"runtime": "docker", "name": "python"})
    'docker.io'
    >>> image_registry({"runtime": "process", "name": "python"}) is None
    True
    """
    if image["runtime"] != "docker":
        return None
    name: str = image["name"]
    first, slash, _ = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


_OPERATION_LABEL = "ai.backend.features"


def is_operation_image(image: dict[str, Any]) -> bool:
    """Backend.AI's "operation" images: labelled ``ai.backend.features`` with
    ``operation`` among its space-separated words."""
    return "operation" in str(image["labels"].get(_OPERATION_LABEL, "")).split()


@strawberry.type(name="ResourceLimit")
class ResourceLimitNode:
    key: str
    min: str | None
    max: str | None


@strawberry.type
class ImageNode:
    """A catalogue image (``GET /images``); ``min_slots`` and ``labels`` are JSON strings.

    Backend.AI's fields: ``id`` is the reference, ``registry`` as :func:`image_registry`,
    ``resource_limits`` the minimum slots (no maximum); ``digest``, ``size_bytes`` and
    ``installed`` are not kept by the catalogue (null)."""

    id: str
    ref: str
    name: str
    tag: str
    registry: str | None
    aliases: list[str]
    architecture: str
    runtime: str
    accelerators: list[str]
    supported_accelerators: list[str]
    min_slots: str
    resource_limits: list[ResourceLimitNode]
    labels: str
    description: str
    digest: str | None = None
    size_bytes: int | None = None
    installed: bool | None = None
    is_local: bool | None = None

    @classmethod
    def from_json(cls, image: dict[str, Any]) -> ImageNode:
        return cls(
            id=image["ref"],
            ref=image["ref"],
            name=image["name"],
            tag=image["tag"],
            registry=image_registry(image),
            aliases=list(image["aliases"]),
            architecture=image["architecture"],
            runtime=image["runtime"],
            accelerators=list(image["accelerators"]),
            supported_accelerators=list(image["accelerators"]),
            min_slots=json.dumps(image["min_slots"]),
            resource_limits=[
                ResourceLimitNode(key=k, min=str(v), max=None)
                for k, v in sorted(image["min_slots"].items())
            ],
            labels=json.dumps(image["labels"]),
            description=image["description"],
        )


@strawberry.type
class Query(AdminQuery, StorageQuery):
    @strawberry.field
    async def images(
        self,
        info: Info,
        runtime: str | None = None,
        is_operation: bool | None = None,
        is_installed: bool | None = None,
        filter: str | None = None,
        order: str | None = None,
    ) -> list[ImageNode]:
        """The image catalogue (any user), optionally of one runtime (process | docker);
        ``is_operation`` true: only operation images, false: all but them (as Backend.AI;
        see :func:`is_operation_image`).  ``is_installed``: only null (the catalogue does
        not track which agent holds which image).  ``filter`` / ``order``: Backend.AI's
        expressions over :data:`~accelshare.manager.list_specs.IMAGES` (by reference
        unless ordered)."""
        manager, _identity = _context(info)
        if is_installed is not None:
            raise ValueError(
                "images(is_installed): accelshare's catalogue does not track installed"
                f" images; expected null, received {is_installed}"
            )
        keep = predicate(filter, IMAGES)  # checked before the catalogue is read
        chosen = [
            i
            for i in await manager.images.list()
            if (runtime is None or i["runtime"] == runtime)
            and (is_operation is None or is_operation_image(i) == is_operation)
            and keep(i)
        ]
        return [ImageNode.from_json(i) for i in sort_items(chosen, order, IMAGES)]

    @strawberry.field
    async def image(
        self,
        info: Info,
        reference: str | None = None,
        architecture: str | None = None,
        id: str | None = None,
    ) -> ImageNode | None:
        """One image by reference or alias (``id`` is the reference too); null if none
        (or not of ``architecture``)."""
        manager, _identity = _context(info)
        ref = reference or id
        if not ref:
            raise ValueError("image: expected a reference or an id, received neither")
        try:
            found = await manager.images.info(ref)
        except ManagerError:
            return None
        if architecture and found["architecture"] != architecture:
            return None
        return ImageNode.from_json(found)

    @strawberry.field
    async def agent(self, info: Info, agent_id: str) -> AgentNode | None:
        manager, identity = _context(info)
        _require_superadmin(identity)
        try:
            return AgentNode.from_row(await manager.get_agent(agent_id))
        except ManagerError:
            return None

    @strawberry.field
    async def agents(
        self, info: Info, status: str | None = None, scaling_group: str | None = None
    ) -> list[AgentNode]:
        manager, identity = _context(info)
        _require_superadmin(identity)
        rows = await manager.list_agents(status=_agent_status(status), scaling_group=scaling_group)
        return [AgentNode.from_row(r) for r in rows]

    @strawberry.field
    async def agent_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        status: str | None = None,
        scaling_group: str | None = None,
        filter: str | None = None,
        order: str | None = None,
    ) -> AgentList:
        manager, identity = _context(info)
        _require_superadmin(identity)
        _page("agent_list", limit, offset)
        rows = await manager.list_agents(
            status=_agent_status(status), scaling_group=scaling_group, filter=filter, order=order
        )
        page = rows[offset : offset + limit]
        return AgentList(items=[AgentNode.from_row(r) for r in page], total_count=len(rows))

    @strawberry.field
    async def compute_session(self, info: Info, id: uuid.UUID) -> ComputeSessionNode | None:
        manager, identity = _context(info)
        try:
            return ComputeSessionNode.from_json(await manager.sessions.get(identity, str(id)))
        except ManagerError:
            return None

    @strawberry.field
    async def compute_session_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        status: str | None = None,
        access_key: str | None = None,
        filter: str | None = None,
        order: str | None = None,
    ) -> ComputeSessionList:
        manager, identity = _context(info)
        _page("compute_session_list", limit, offset)
        statuses = session_statuses(status)
        if statuses is None:
            statuses = list(SessionStatus)
        if access_key and identity.role is UserRole.USER and access_key != identity.access_key:
            return ComputeSessionList(items=[], total_count=0)
        page = await manager.sessions.list_sessions(
            identity,
            statuses=statuses,
            access_key=access_key,
            limit=limit,
            offset=offset,
            filter=filter,
            order=order,
        )
        return ComputeSessionList(
            items=[ComputeSessionNode.from_json(s) for s in page["items"]],
            total_count=page["total"],
        )

    @strawberry.field
    async def vfolder_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        group_id: uuid.UUID | None = None,
        filter: str | None = None,
        order: str | None = None,
    ) -> VirtualFolderList:
        """The caller's storage folders (own, project, shared; a superadmin: every one)."""
        return await _folder_page(
            info, "vfolder_list", limit, offset, filter, order, group_id=group_id
        )

    @strawberry.field
    async def vfolder_own_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
    ) -> VirtualFolderList:
        """The user folders the caller owns (``backend.ai vfolder list-own``; every role:
        a superadmin's own too)."""
        return await _folder_page(
            info, "vfolder_own_list", limit, offset, filter, order, scope=FolderScope.OWN
        )

    @strawberry.field
    async def vfolder_invited_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
    ) -> VirtualFolderList:
        """Other users' folders shared with the caller by an accepted invitation
        (``backend.ai vfolder list-invited``), with the permission it was given."""
        return await _folder_page(
            info, "vfolder_invited_list", limit, offset, filter, order, scope=FolderScope.INVITED
        )

    @strawberry.field
    async def vfolder_project_list(
        self,
        info: Info,
        limit: int = 20,
        offset: int = 0,
        filter: str | None = None,
        order: str | None = None,
    ) -> VirtualFolderList:
        """The project folders of the caller's projects (``backend.ai vfolder
        list-project``)."""
        return await _folder_page(
            info, "vfolder_project_list", limit, offset, filter, order, scope=FolderScope.PROJECT
        )

    @strawberry.field
    async def keypair(
        self, info: Info, access_key: str | None = None, domain_name: str | None = None
    ) -> KeyPairNode | None:
        """The caller's keypair, or one it may see (admin: its domain; superadmin: any)."""
        manager, identity = _context(info)
        row = await manager.admin_views.keypair(identity, access_key or identity.access_key)
        if row is None or (domain_name and row["domain_name"] != domain_name):
            return None
        return keypair_from_row(row)


async def _folder_page(
    info: Info,
    query: str,
    limit: int,
    offset: int,
    filter: str | None,
    order: str | None,
    *,
    group_id: uuid.UUID | None = None,
    scope: FolderScope = FolderScope.VISIBLE,
) -> VirtualFolderList:
    """One page of the caller's folders of ``scope`` (``vfolder_list``: a superadmin's
    holds every folder), ``total_count`` all of them."""
    manager, identity = _context(info)
    _page(query, limit, offset)
    items = await manager.folders.list_folders(
        identity,
        all_=identity.is_superadmin,
        group_id=group_id,
        filter=filter,
        order=order,
        scope=scope,
    )
    page = items[offset : offset + limit]
    return VirtualFolderList(
        items=[VirtualFolderNode.from_item(i, identity.domain_name) for i in page],
        total_count=len(items),
    )


@strawberry.input(name="ModifyComputeSessionInput")
class ModifyComputeSessionInput:
    """Backend.AI's relay input: ``id`` is the session's UUID (or its relay global id,
    base64 of ``ComputeSessionNode:<uuid>``)."""

    id: str
    name: str | None = None
    priority: int | None = None
    client_mutation_id: str | None = strawberry.field(default=None, name="clientMutationId")


@strawberry.type(name="ModifyComputeSessionPayload")
class ModifyComputeSessionPayload:
    item: ComputeSessionNode | None
    client_mutation_id: str | None = strawberry.field(name="clientMutationId")


@strawberry.type(name="RescanGPUAllocMaps")
class RescanGPUAllocMaps:
    """Backend.AI starts a background task that re-reads an agent's GPU allocation maps
    and answers its id.  accelshare reads the maps live from the agent at every
    ``gpu_alloc_map`` query, so there is nothing to rescan and no task: ``task_id`` is
    ``null`` (Backend.AI's field is nullable)."""

    task_id: uuid.UUID | None


@strawberry.type(name="ForgetImage")
class ForgetImageResult:
    """Backend.AI's answer to ``forget_image`` and ``forget_image_by_id``: ``image`` is
    the image as it was in the catalogue (with the aliases that went with it)."""

    ok: bool
    msg: str
    image: ImageNode | None


async def _forget_image(info: Info, name: str, architecture: str | None) -> ForgetImageResult:
    """Remove an image from the catalogue (superadmin), as ``DELETE
    /admin/images/{name}``: its aliases go with it; sessions that use it keep running
    and keep its name.  An unknown image (or one of another ``architecture``) is an
    error naming it."""
    manager, identity = _context(info)
    _require_superadmin(identity)
    image = await manager.images.info(name)
    if architecture is not None and image["architecture"] != architecture:
        raise LookupError(
            f"forget_image(architecture): {image['ref']} is an image for"
            f" {image['architecture']}; expected {image['architecture']!r}, received"
            f" {architecture!r}"
        )
    ref = await manager.images.remove(image["ref"])
    return ForgetImageResult(ok=True, msg=f"{ref} is forgotten", image=ImageNode.from_json(image))


def session_ref_of(global_id: str) -> str:
    """A session UUID from Backend.AI's relay global id or the UUID itself.

    >>> session_ref_of("c59395cd-ac91-4cd3-a1b0-3d2568aa2d01")
    'c59395cd-ac91-4cd3-a1b0-3d2568aa2d01'
    >>> session_ref_of("Q29tcHV0ZVNlc3Npb25Ob2RlOmM1OTM5NWNkLWFjOTEtNGNkMy1hMWIwLTNkMjU2OGFhMmQwMQ==")
    'c59395cd-ac91-4cd3-a1b0-3d2568aa2d01'
    """
    try:
        return str(uuid.UUID(global_id))
    except ValueError:
        pass
    try:
        decoded = base64.b64decode(global_id, validate=True).decode()
        return str(uuid.UUID(decoded.partition(":")[2]))
    except ValueError:
        raise ValueError(
            f"modify_compute_session(input.id): expected a session UUID or its relay global"
            f" id, received {global_id!r}"
        ) from None


@strawberry.type
class Mutation(AdminMutation):
    @strawberry.mutation
    async def modify_compute_session(
        self, info: Info, input: ModifyComputeSessionInput
    ) -> ModifyComputeSessionPayload:
        """Backend.AI's ``set-priority`` (and ``update(name=...)``): the priority of a
        PENDING session, the name of a live one (the session service's rules)."""
        manager, identity = _context(info)
        session = await manager.sessions.modify(
            identity, session_ref_of(input.id), name=input.name, priority=input.priority
        )
        return ModifyComputeSessionPayload(
            item=ComputeSessionNode.from_json(session), client_mutation_id=input.client_mutation_id
        )

    @strawberry.mutation
    async def forget_image(
        self, info: Info, reference: str, architecture: str | None = None
    ) -> ForgetImageResult:
        """``backend.ai image forget REF --arch ARCH``: see :func:`_forget_image`."""
        return await _forget_image(info, reference, architecture)

    @strawberry.mutation
    async def forget_image_by_id(self, info: Info, image_id: str) -> ForgetImageResult:
        """``backend.ai image forget REF``: ``image_id`` is an ``Image``'s ``id`` (its
        reference; an alias names its image too); see :func:`_forget_image`."""
        return await _forget_image(info, image_id, None)

    @strawberry.mutation
    async def rescan_gpu_alloc_maps(self, info: Info, agent_id: str) -> RescanGPUAllocMaps:
        """Superadmin; the agent must exist.  See :class:`RescanGPUAllocMaps`."""
        manager, identity = _context(info)
        _require_superadmin(identity)
        await manager.get_agent(agent_id)
        return RescanGPUAllocMaps(task_id=None)


class _Schema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        """One line per request (strawberry logs a traceback per error: a thousand
        aliases of a refused field wrote megabytes); a traceback only for a bug."""
        context = execution_context.context if execution_context is not None else None
        identity = context.get("identity") if isinstance(context, dict) else None
        who = identity.email if isinstance(identity, Identity) else "?"
        unexpected = [
            e
            for e in errors
            if e.original_error is not None and not isinstance(e.original_error, _EXPECTED_ERRORS)
        ]
        if unexpected:
            first = unexpected[0].original_error
            log.error(
                "graphql: %d error(s) for %s, %d unexpected; the first:",
                len(errors),
                who,
                len(unexpected),
                exc_info=(type(first), first, first.__traceback__) if first else None,
            )
        else:
            log.info(
                "graphql: %d error(s) for %s; the first: %.200s",
                len(errors),
                who,
                errors[0].message,
            )


schema = _Schema(
    query=Query,
    mutation=Mutation,
    config=StrawberryConfig(auto_camel_case=False),
    extensions=[RefusedRootFields],
)


async def _operation_type(request: Request, identity: Identity) -> OperationType | None:
    """The type of the operation the request runs, its document first checked against
    the cost limits (a 400 ``graphql-too-complex`` before strawberry parses it).

    The operation is the one strawberry picks: the one ``operationName`` names, else the
    document's first (strawberry runs the first of several when no name is given).  None
    where strawberry refuses the request itself: a body that is not a JSON object with a
    string ``query``, a syntax error, no operation of that name."""
    limits = getattr(request.app.state, "graphql_limits", None) or GraphQLLimits()
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None  # strawberry answers the malformed body
    query = body.get("query") if isinstance(body, dict) else None
    if not isinstance(query, str):
        return None
    try:
        document = parse_document(query, limits)
        if document is None:
            return None
        check_cost(document, limits)
    except LimitExceeded as e:
        log.warning(
            "graphql: refused a request of %s: %s = %s, the request had %s",
            identity.email,
            e.limit,
            e.value,
            e.received,
        )
        raise QueryTooComplex(
            str(e),
            field="query",
            expected=f"{e.limit} = {e.value}",
            received=e.received,
            limit=e.limit,
            limit_value=e.value,
        ) from None
    name = body.get("operationName")
    if name is not None and not isinstance(name, str):
        return None  # strawberry finds no operation of that name
    try:
        return get_operation_type(document, name)
    except RuntimeError:  # no such operation: strawberry says so
        return None


async def _get_context(
    request: Request,
    identity: Annotated[Identity, Depends(current_identity)],
    manager: Annotated[Manager, Depends(manager_dependency)],
) -> dict[str, Any]:
    if await _operation_type(request, identity) is OperationType.MUTATION:
        # Backend.AI's GQLMutationUnfrozenRequiredMiddleware: no mutation runs while the
        # manager is frozen (queries do); the whole request is the 503 problem
        # server-frozen, as POST /session is
        await manager.maintenance.refuse_if_frozen()
    return {"identity": identity, "manager": manager}


def create_graphql_router() -> GraphQLRouter[Any, Any]:
    return GraphQLRouter(
        schema,
        graphql_ide=None,
        allow_queries_via_get=False,
        context_getter=_get_context,
        tags=["graphql"],
    )
