"""GraphQL pieces for the official Backend.AI client (issue #12; see docs/compatibility.md).

The client builds its queries from fixed field lists (``ai.backend.client.output.fields``)
and sends arguments accelshare has no use for; a query that names an unknown field or
argument fails as a whole, so the schema carries them:

* ``keypair(access_key)`` — ``backend.ai ps`` asks ``keypair { is_admin ... }`` first
  (``secret_key`` is null but in ``create_keypair``'s answer: secrets are shown once);
* ``compute_session_list(..., filter, order, group_id)`` and ``agent_list(..., filter,
  order)``: Backend.AI's filter / order mini-language (:mod:`accelshare.manager.querylang`);
* Backend.AI's statuses accelshare never uses (``RESTARTING``, ``RUNNING_DEGRADED``) are
  accepted in status filters and simply match nothing;
* ``vfolder_list``: the caller's storage folders (own, project, shared; a superadmin:
  all), paged like the other lists;
* the session fields ``backend.ai session info`` prints (``containers { ... }``,
  ``dependencies { name id }``, ``group_name``, ``occupying_slots``...) and the agent
  fields ``backend.ai admin agent list/info`` print (``cpu_cur_pct``, ``mem_cur_bytes``,
  ``hardware_metadata``, ``live_stat``, ``local_config``).  What accelshare does not
  measure is ``null`` (the client prints "(null)" or nothing), never invented.

JSON-valued fields are JSON *strings*, as Backend.AI's ``JSONString``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import strawberry

from accelshare.manager.agents import AgentRecord
from accelshare.manager.runtime import Manager
from accelshare.sched.lifecycle import SessionStatus

__all__ = [
    "BACKENDAI_ONLY_STATUSES",
    "ContainerNode",
    "DependencyNode",
    "KeyPairNode",
    "KeyPairUserInfo",
    "VirtualFolderList",
    "VirtualFolderNode",
    "containers_of",
    "group_name",
    "hardware_metadata",
    "keypair_from_row",
    "session_statuses",
    "user_email",
]

BACKENDAI_ONLY_STATUSES = frozenset({"RESTARTING", "RUNNING_DEGRADED"})
"""Session statuses of Backend.AI that accelshare never uses (they match nothing)."""


def session_statuses(status: str | None) -> list[SessionStatus] | None:
    """``"RUNNING,PENDING"`` -> statuses; None for no filter.

    >>> session_statuses("RUNNING,RUNNING_DEGRADED")
    [<SessionStatus.RUNNING: 'RUNNING'>]
    """
    if not status:
        return None
    wanted: list[SessionStatus] = []
    for raw in status.split(","):
        name = raw.strip().upper()
        if name in BACKENDAI_ONLY_STATUSES:
            continue
        try:
            wanted.append(SessionStatus(name))
        except ValueError:
            raise ValueError(
                f"Unknown session status in {status!r}: expected some of {', '.join(SessionStatus)}"
            ) from None
    return wanted


def _json(value: Any) -> str:
    return json.dumps(value)


# -- keypair ------------------------------------------------------------------------------
@strawberry.type(name="KeyPairUserInfo")
class KeyPairUserInfo:
    email: str
    full_name: str


@strawberry.type(name="KeyPair")
class KeyPairNode:
    user_id: str  # Backend.AI: the owner's email
    user: str  # the owner's UUID
    access_key: str
    # Asked for by the client, answered only by create_keypair: a secret key is shown
    # once, when it is created.
    secret_key: str | None
    is_active: bool
    is_admin: bool
    resource_policy: str
    created_at: str | None
    last_used: str | None
    domain_name: str
    projects: list[str]
    user_info: KeyPairUserInfo
    concurrency_used: int  # the keypair's live (not yet terminated) sessions
    # Backend.AI's settings accelshare does not keep: null.
    modified_at: str | None = None
    rate_limit: int | None = None
    num_queries: int | None = None
    ssh_public_key: str | None = None
    ssh_private_key: str | None = None
    dotfiles: str | None = None
    bootstrap_script: str | None = None


def keypair_from_row(row: Mapping[str, Any]) -> KeyPairNode:
    """A keypair of :meth:`~accelshare.manager.services.admin_views.AdminViews.keypairs`."""
    return KeyPairNode(
        user_id=row["user_email"],
        user=row["user_uuid"],
        access_key=row["access_key"],
        secret_key=None,
        is_active=row["is_active"],
        is_admin=row["is_admin"],
        resource_policy=row["resource_policy"],
        created_at=row["created_at"],
        last_used=row["last_used_at"],
        domain_name=row["domain_name"],
        projects=list(row["projects"]),
        user_info=KeyPairUserInfo(email=row["user_email"], full_name=row["full_name"]),
        concurrency_used=row["concurrency_used"],
    )


# -- sessions -----------------------------------------------------------------------------
@strawberry.type(name="ComputeContainer")
class ContainerNode:
    """A kernel, as Backend.AI's ``containers { ... }`` shows it (single-node sessions:
    one ``main`` kernel)."""

    id: str
    cluster_role: str
    cluster_idx: int
    cluster_hostname: str
    session_id: str
    image: str
    registry: str | None
    status: str
    status_info: str | None
    status_data: str
    status_changed: str | None
    agent: str | None
    container_id: str | None
    resource_opts: str
    occupied_slots: str
    preopen_ports: list[int]
    live_stat: str | None
    last_stat: str | None


def containers_of(session: Mapping[str, Any]) -> list[ContainerNode]:
    """The kernels of a session's full JSON (``GET /session/{id}``)."""
    return [
        ContainerNode(
            id=k["kernelId"],
            cluster_role="main",
            cluster_idx=idx + 1,
            cluster_hostname=f"main{idx + 1}",
            session_id=session["sessionId"],
            image=session["image"],
            registry=None,
            status=k["status"],
            status_info=session["statusInfo"],
            status_data=_json(session["statusData"]),
            status_changed=session["statusChangedAt"],
            agent=k["agentId"],
            container_id=k["containerId"],
            resource_opts=_json(session["resourceOpts"]),
            occupied_slots=_json(k["occupiedSlots"]),
            preopen_ports=[],
            live_stat=None,
            last_stat=None,
        )
        for idx, k in enumerate(session.get("kernels") or [])
    ]


@strawberry.type(name="ComputeSessionDependency")
class DependencyNode:
    id: str
    name: str | None
    status: str | None


async def group_name(manager: Manager, group_id: str) -> str | None:
    return await manager.directory.group_name(group_id)


async def user_email(manager: Manager, user_id: str) -> str | None:
    return await manager.directory.user_email(user_id)


# -- agents -------------------------------------------------------------------------------
def hardware_metadata(agent: AgentRecord) -> str:
    """``{plugin: {status, status_info, metadata}}`` from the plugins the agent reported."""
    plugins = agent.compute_plugins or {}
    return _json(
        {
            key: {
                "status": "healthy",
                "status_info": None,
                "metadata": dict(info) if isinstance(info, Mapping) else {},
            }
            for key, info in plugins.items()
        }
    )


# -- virtual folders ----------------------------------------------------------------------
@strawberry.type(name="VirtualFolder")
class VirtualFolderNode:
    """Backend.AI's vfolder, from a ``/folders`` item (``FolderService``'s JSON)."""

    id: str
    host: str
    name: str
    user: str | None
    group: str | None
    group_id: str | None
    creator: str | None
    status: str
    unmanaged_path: str | None
    usage_mode: str
    permission: str
    ownership_type: str
    max_files: int
    max_size: int
    created_at: str | None
    last_used: str | None
    num_files: int
    cur_size: int
    cloneable: bool
    endpoint_id: str | None
    domain: str | None

    @classmethod
    def from_item(cls, item: Mapping[str, Any], domain: str | None) -> VirtualFolderNode:
        return cls(
            id=str(item["id"]),
            host=str(item["host"]),
            name=str(item["name"]),
            user=item.get("user"),
            group=item.get("group"),
            group_id=item.get("group"),
            creator=item.get("creator"),
            status=str(item["status"]),
            unmanaged_path=None,
            usage_mode=str(item["usage_mode"]),
            permission=str(item["permission"]),
            ownership_type=str(item["ownership_type"]),
            max_files=0,
            max_size=int(item.get("max_size") or 0),
            created_at=item.get("created_at"),
            last_used=None,
            num_files=0,  # usage is the storage proxy's: `vfolder info` asks it
            cur_size=0,
            cloneable=bool(item.get("cloneable")),
            endpoint_id=None,
            domain=domain,
        )


@strawberry.type(name="VirtualFolderList")
class VirtualFolderList:
    items: list[VirtualFolderNode]
    total_count: int
