"""Typed results of the SDK (the manager's JSON, read with its own field names).

Every model keeps fields it does not declare (``extra="allow"``), so
``model_dump(by_alias=True, mode="json")`` gives back what the server sent (amounts
as decimal strings) and a newer manager's additions are never lost.  Amounts are
``Decimal``: ``"0.6"`` stays exactly 0.6.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from accelshare.protocol import PluginMapView
from accelshare.sched.lifecycle import FINAL_STATUSES

__all__ = [
    "AgentInfo",
    "AllocMap",
    "CompatAllocMap",
    "CreatedSession",
    "CreatedUser",
    "DestroyedSession",
    "ImageInfo",
    "KernelInfo",
    "KeypairInfo",
    "ResourcePolicyInfo",
    "ScalingGroupAssociations",
    "ScalingGroupInfo",
    "SessionEvent",
    "SessionInfo",
    "SessionPage",
    "StatusChange",
    "UserInfo",
    "WhyPending",
]

Slots = dict[str, Decimal]  # slot -> amount
# quotas and limits: "Infinity" is unlimited
Limits = dict[str, Annotated[Decimal, Field(allow_inf_nan=True)]]
DeviceAllocs = dict[str, dict[str, Decimal]]  # slot -> device -> amount


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The server's shape again (aliases, decimal strings), for ``--json``."""
        return self.model_dump(by_alias=True, mode="json")


class StatusChange(_Model):
    from_status: str | None = Field(default=None, alias="from")
    to: str
    reason: str | None = None
    at: str | None = None


class KernelInfo(_Model):
    kernel_id: str = Field(alias="kernelId")
    agent_id: str | None = Field(default=None, alias="agentId")
    status: str
    container_id: str | None = Field(default=None, alias="containerId")
    device_allocs: DeviceAllocs = Field(default_factory=dict, alias="deviceAllocs")
    occupied_slots: Slots = Field(default_factory=dict, alias="occupiedSlots")


class SessionInfo(_Model):
    session_id: str = Field(alias="sessionId")
    name: str = Field(alias="sessionName")
    type: str = "interactive"
    status: str
    status_info: str | None = Field(default=None, alias="statusInfo")
    status_data: dict[str, Any] = Field(default_factory=dict, alias="statusData")
    image: str = ""
    requested_slots: Slots = Field(default_factory=dict, alias="requestedSlots")
    occupied_slots: Slots = Field(default_factory=dict, alias="occupiedSlots")
    priority: int = 10
    scaling_group: str | None = Field(default=None, alias="scalingGroup")
    agent_id: str | None = Field(default=None, alias="agentId")
    access_key: str | None = Field(default=None, alias="accessKey")
    exit_code: int | None = Field(default=None, alias="exitCode")
    created_at: str | None = Field(default=None, alias="creationTime")
    started_at: str | None = Field(default=None, alias="startedAt")
    terminated_at: str | None = Field(default=None, alias="terminationTime")
    kernels: list[KernelInfo] = Field(default_factory=list)
    status_history: list[StatusChange] = Field(default_factory=list, alias="statusHistory")
    #: ``[{name, protocol, port, hostPort?}]``: the app services; ``hostPort`` (the
    #: agent host's port, ``[container] port-range``) once the agent reported it.
    service_ports: list[dict[str, Any]] = Field(default_factory=list, alias="servicePorts")

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def pending_reason(self) -> str:
        """The scheduler's last word on a PENDING session (or the status info)."""
        scheduler = self.status_data.get("scheduler") or {}
        msg = scheduler.get("msg") if isinstance(scheduler, dict) else None
        return str(msg or self.status_info or "not looked at by the scheduler yet")


class CreatedSession(_Model):
    session_id: str = Field(alias="sessionId")
    session_name: str = Field(alias="sessionName")
    status: str
    status_info: str | None = Field(default=None, alias="statusInfo")
    created: bool = True
    service_ports: list[dict[str, Any]] = Field(default_factory=list, alias="servicePorts")
    session: SessionInfo


class DestroyedSession(_Model):
    session_id: str = Field(alias="sessionId")
    session_name: str = Field(alias="sessionName")
    status: str
    status_info: str | None = Field(default=None, alias="statusInfo")


class SessionPage(_Model):
    items: list[SessionInfo]
    total: int
    limit: int
    offset: int


class WhyPending(_Model):
    session_id: str = Field(alias="sessionId")
    session_name: str = Field(alias="sessionName")
    status: str
    status_info: str | None = Field(default=None, alias="statusInfo")
    scheduler: dict[str, Any] = Field(default_factory=dict)
    agents: list[str] = Field(default_factory=list)
    explanation: str = ""


class SessionEvent(_Model):
    """One status change from ``GET /session/{ref}/events``."""

    session_id: str = Field(alias="sessionId")
    from_status: str | None = Field(default=None, alias="from")
    status: str
    reason: str | None = None
    at: str | None = None


class AllocMap(_Model):
    """An agent's allocation map, every plugin: ``maps[plugin].devices[i]`` holds
    ``device_id``, ``slot_name``, ``capacity``, ``allocated`` and the kernels."""

    agent_id: str
    maps: dict[str, PluginMapView] = Field(default_factory=dict)
    source: str | None = None  # "agent" (live) or "heartbeat" (the agent did not answer)
    error: str | None = None


class CompatAllocMap(_Model):
    """Backend.AI's ``{device: "0.80"}`` form (accelerator slots only)."""

    alloc_map: dict[str, str] = Field(default_factory=dict)
    source: str | None = None
    error: str | None = None


class AgentInfo(_Model):
    id: str
    status: str
    scaling_group: str | None = Field(default=None, alias="scalingGroup")
    address: str | None = None
    region: str | None = None
    architecture: str | None = None
    version: str | None = None
    is_schedulable: bool = Field(default=True, alias="isSchedulable")
    available_slots: Slots = Field(default_factory=dict, alias="availableSlots")
    occupied_slots: Slots = Field(default_factory=dict, alias="occupiedSlots")
    compute_plugins: dict[str, Any] = Field(default_factory=dict, alias="computePlugins")
    quanta: dict[str, Any] = Field(default_factory=dict)
    first_contact: str | None = Field(default=None, alias="firstContact")
    last_heartbeat: str | None = Field(default=None, alias="lastHeartbeat")
    lost_at: str | None = Field(default=None, alias="lostAt")
    status_data: dict[str, Any] = Field(default_factory=dict, alias="statusData")
    # GET /agents/{id} only: the last heartbeat's map and the plugins' UI metadata
    alloc_map: AllocMap | None = Field(default=None, alias="allocMap")
    slot_metadata: dict[str, Any] = Field(default_factory=dict, alias="slotMetadata")


# -- administration (client.admin) ---------------------------------------------------------


class _AdminModel(_Model):
    def to_json(self) -> dict[str, Any]:
        """Exactly the fields the server sent (a listing's keypair has no ``secret_key``)."""
        return self.model_dump(by_alias=True, mode="json", exclude_unset=True)


class UserInfo(_AdminModel):
    id: str
    email: str
    username: str | None = None
    full_name: str | None = None
    role: str
    status: str
    domain_name: str | None = None
    total_resource_slots: Limits = Field(default_factory=dict)
    created_at: str | None = None


class KeypairInfo(_AdminModel):
    access_key: str
    user_id: str | None = None
    user_email: str | None = None
    resource_policy: str | None = None
    is_active: bool
    is_admin: bool
    created_at: str | None = None
    last_used_at: str | None = None
    secret_key: str | None = None  # only in the answer that created the keypair


class CreatedUser(_AdminModel):
    user: UserInfo
    keypair: KeypairInfo | None = None  # with its secret_key (shown this once)


class ResourcePolicyInfo(_AdminModel):
    name: str
    default_for_unspecified: str
    total_resource_slots: Limits = Field(default_factory=dict)
    max_concurrent_sessions: int = 0
    max_pending_session_count: int | None = None
    max_pending_session_resource_slots: Limits | None = None
    idle_timeout: int = 0
    created_at: str | None = None


class ScalingGroupInfo(_AdminModel):
    name: str
    description: str | None = None
    is_active: bool = True
    is_public: bool = True
    scheduler: str
    scheduler_opts: dict[str, Any] = Field(default_factory=dict)
    default_session_slots: Limits = Field(default_factory=dict)
    created_at: str | None = None


class ScalingGroupAssociations(_AdminModel):
    """Who may use a scaling group: the domains, projects (group ids) and access keys it
    is associated with."""

    domains: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    keypairs: list[str] = Field(default_factory=list)


class ImageInfo(_AdminModel):
    """A catalogue image (``GET /images``; docs/images.md)."""

    ref: str
    name: str
    tag: str
    aliases: list[str] = Field(default_factory=list)
    architecture: str = "x86_64"
    runtime: str = "process"
    accelerators: list[str] = Field(default_factory=list)
    labels: dict[str, Any] = Field(default_factory=dict)
    min_slots: Slots = Field(default_factory=dict)
    description: str = ""
    created_at: str | None = None
