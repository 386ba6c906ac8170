"""The filter / order fields of the lists the API serves (Backend.AI's field names;
:mod:`.querylang`).

``compute_session_list``: id, session_id, type, name, session_name, priority, image,
agent / agent_id / agent_ids / agents, domain_name, group_name, user_email, user_id,
full_name, access_key, scaling_group, cluster_mode, cluster_size, status, status_info,
result, created_at, scheduled_at, terminated_at, starts_at, startup_command, tag.

``agent_list``: id, status, status_changed, region, scaling_group, schedulable, addr,
architecture, version, first_contact, last_heartbeat, lost_at.

``user_list``: uuid, username, email, full_name, is_active, status, role, domain_name,
created_at, modified_at.

``keypair_list``: access_key, user_id (the owner's UUID), email, full_name, is_active,
is_admin, resource_policy, created_at, last_used.

``images`` (served from the catalogue in memory): name, tag, reference, architecture,
runtime, description.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from accelshare.manager.enums import (
    AgentStatus,
    UserRole,
    UserStatus,
    VFolderOwnershipType,
    VFolderPermission,
    VFolderStatus,
    VFolderUsageMode,
)
from accelshare.sched.lifecycle import SessionResult, SessionStatus
from accelshare.sched.model import SessionType

from .models import Agent, Group, Keypair, Session, User, VFolder
from .querylang import Field, FieldType, ListSpec, OrderItem

__all__ = ["AGENTS", "IMAGES", "KEYPAIRS", "SESSIONS", "USERS", "VFOLDERS", "ClusterMode"]

F = FieldType


class ClusterMode(enum.StrEnum):
    """Backend.AI's cluster modes; accelshare's sessions are all single-node."""

    SINGLE_NODE = "single-node"
    MULTI_NODE = "multi-node"


_user_email = (
    sa.select(User.email).where(User.id == Session.user_id).scalar_subquery().label("user_email")
)
_full_name = (
    sa.select(User.full_name).where(User.id == Session.user_id).scalar_subquery().label("full_name")
)
_group_name = (
    sa.select(Group.name).where(Group.id == Session.group_id).scalar_subquery().label("group_name")
)
_agent = Field(F.STRING, Session.agent_id, nullable=True)

SESSIONS = ListSpec(
    name="compute_session_list",
    fields={
        "id": Field(F.UUID, Session.id),
        "session_id": Field(F.UUID, Session.id),
        "type": Field(
            F.ENUM,
            Session.session_type,
            enum_type=SessionType,
            unmatched=frozenset({"INFERENCE", "SYSTEM"}),
        ),
        "name": Field(F.STRING, Session.name),
        "session_name": Field(F.STRING, Session.name),
        "priority": Field(F.INTEGER, Session.priority),
        "image": Field(F.STRING, Session.image),
        "agent": _agent,
        "agent_id": _agent,
        "agent_ids": _agent,
        "agents": _agent,
        "domain_name": Field(F.STRING, Session.domain_name),
        "group_name": Field(F.STRING, _group_name),
        "user_email": Field(F.STRING, _user_email),
        "user_id": Field(F.UUID, Session.user_id),
        "full_name": Field(F.STRING, _full_name),
        "access_key": Field(F.STRING, Session.access_key),
        "scaling_group": Field(F.STRING, Session.scaling_group),
        "cluster_mode": Field(
            F.ENUM, sa.literal(ClusterMode.SINGLE_NODE.value, sa.String()), enum_type=ClusterMode
        ),
        "cluster_size": Field(F.INTEGER, Session.cluster_size),
        "status": Field(
            F.ENUM,
            Session.status,
            enum_type=SessionStatus,
            unmatched=frozenset({"RESTARTING", "RUNNING_DEGRADED"}),
        ),
        "status_info": Field(F.STRING, Session.status_info, nullable=True),
        "result": Field(F.ENUM, Session.result, enum_type=SessionResult),
        "created_at": Field(F.DATETIME, Session.created_at),
        "scheduled_at": Field(F.DATETIME, Session.scheduled_at, nullable=True),
        "terminated_at": Field(F.DATETIME, Session.terminated_at, nullable=True),
        "starts_at": Field(F.DATETIME, Session.starts_at, nullable=True),
        "startup_command": Field(F.STRING, Session.startup_command, nullable=True),
        "tag": Field(F.STRING, Session.tag, nullable=True),
    },
    tiebreak=("id",),
    default_order=(OrderItem("created_at", descending=False, column=1),),
)
"""``compute_session_list``: a default order of oldest first (then id), as before."""

AGENTS = ListSpec(
    name="agent_list",
    fields={
        "id": Field(F.STRING, Agent.id),
        "status": Field(F.ENUM, Agent.status, enum_type=AgentStatus),
        "status_changed": Field(F.DATETIME, Agent.status_changed_at),
        "region": Field(F.STRING, Agent.region),
        "scaling_group": Field(F.STRING, Agent.scaling_group),
        "schedulable": Field(F.BOOLEAN, Agent.is_schedulable),
        "addr": Field(F.STRING, Agent.address),
        "architecture": Field(F.STRING, Agent.architecture),
        "version": Field(F.STRING, Agent.version),
        "first_contact": Field(F.DATETIME, Agent.first_contact_at),
        "last_heartbeat": Field(F.DATETIME, Agent.last_heartbeat_at),
        "lost_at": Field(F.DATETIME, Agent.lost_at, nullable=True),
    },
    tiebreak=("id",),
    default_order=(OrderItem("id", descending=False, column=1),),
)
"""``agent_list``: by id unless ordered."""

USERS = ListSpec(
    name="user_list",
    fields={
        "uuid": Field(F.UUID, User.id),
        "username": Field(F.STRING, User.username, nullable=True),
        "email": Field(F.STRING, User.email),
        "full_name": Field(F.STRING, User.full_name),
        "is_active": Field(F.BOOLEAN, User.status == UserStatus.ACTIVE),
        "status": Field(
            F.ENUM,
            User.status,
            enum_type=UserStatus,
            unmatched=frozenset({"BEFORE-VERIFICATION"}),  # Backend.AI's; never here
        ),
        "role": Field(F.ENUM, User.role, enum_type=UserRole, unmatched=frozenset({"MONITOR"})),
        "domain_name": Field(F.STRING, User.domain_name),
        "created_at": Field(F.DATETIME, User.created_at),
        "modified_at": Field(F.DATETIME, User.modified_at),
    },
    tiebreak=("email",),
)
"""``user_list`` (its query selects users)."""

KEYPAIRS = ListSpec(
    name="keypair_list",
    fields={
        "access_key": Field(F.STRING, Keypair.access_key),
        "user_id": Field(F.UUID, User.id),
        "email": Field(F.STRING, User.email),
        "full_name": Field(F.STRING, User.full_name),
        "is_active": Field(F.BOOLEAN, Keypair.is_active),
        "is_admin": Field(F.BOOLEAN, Keypair.is_admin),
        "resource_policy": Field(F.STRING, Keypair.resource_policy),
        "created_at": Field(F.DATETIME, Keypair.created_at),
        "last_used": Field(F.DATETIME, Keypair.last_used_at, nullable=True),
    },
    tiebreak=("access_key",),
)
"""``keypair_list`` (its query joins each keypair to its owner)."""


VFOLDERS = ListSpec(
    name="vfolder_list",
    fields={
        "id": Field(F.UUID, VFolder.id),
        "host": Field(F.STRING, VFolder.host),
        "name": Field(F.STRING, VFolder.name),
        "status": Field(F.ENUM, VFolder.status, enum_type=VFolderStatus),
        "usage_mode": Field(F.ENUM, VFolder.usage_mode, enum_type=VFolderUsageMode),
        "permission": Field(F.ENUM, VFolder.permission, enum_type=VFolderPermission),
        "ownership_type": Field(F.ENUM, VFolder.ownership_type, enum_type=VFolderOwnershipType),
        "creator": Field(F.STRING, VFolder.creator),
        "user": Field(F.UUID, VFolder.user_id, nullable=True),
        "group": Field(F.UUID, VFolder.group_id, nullable=True),
        "cloneable": Field(F.BOOLEAN, VFolder.cloneable),
        "created_at": Field(F.DATETIME, VFolder.created_at),
        "last_used": Field(F.DATETIME, VFolder.last_used, nullable=True),
    },
    tiebreak=("id",),
    default_order=(OrderItem("created_at", descending=False, column=1),),
)
"""``vfolder_list`` (the caller's storage folders; ``permission`` is the folder's own,
a project folder's for its members): oldest first unless ordered."""


def _image_key(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda image: image[key]


IMAGES = ListSpec(
    name="images",
    fields={
        "name": Field(F.STRING, get=_image_key("name")),
        "tag": Field(F.STRING, get=_image_key("tag")),
        "reference": Field(F.STRING, get=_image_key("ref")),
        "architecture": Field(F.STRING, get=_image_key("architecture")),
        "runtime": Field(F.STRING, get=_image_key("runtime")),
        "description": Field(F.STRING, get=_image_key("description")),
    },
    tiebreak=("reference",),
    default_order=(OrderItem("reference", descending=False, column=1),),
)
"""``images``: the catalogue's images (JSON objects as ``GET /images`` gives them), by
reference unless ordered."""
