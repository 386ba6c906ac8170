"""Admin routes: users, keypairs (admin: own domain; superadmin: all), resource policies
and scaling groups (superadmin).

| route | body | answer |
|---|---|---|
| ``GET /admin/users[?domain=]`` | | ``{"items": [user]}`` |
| ``POST /admin/users`` | ``{email, password, username?, full_name?, role?, domain_name?, group?, resource_policy?, with_keypair?}`` | 201 ``{"user": user, "keypair": {access_key, secret_key, ...} or null}`` |
| ``PATCH /admin/users/{email}`` | ``{password?, role?, status?, full_name?, total_resource_slots?}`` | ``{"user": user}`` |
| ``DELETE /admin/users/{email}`` | | status ``deleted``, keypairs deactivated |
| ``GET /admin/keypairs[?user_email=]`` | | ``{"items": [keypair]}`` (no secrets) |
| ``POST /admin/keypairs`` | ``{user_email, resource_policy?, is_active?, is_admin?}`` | 201 keypair with ``secret_key`` (shown once) |
| ``PATCH /admin/keypairs/{access_key}`` | ``{is_active?, is_admin?, resource_policy?}`` | keypair |
| ``DELETE /admin/keypairs/{access_key}`` | | 409 if sessions reference it (deactivate instead) |
| ``GET/POST /admin/resource-policies``, ``PATCH/DELETE /admin/resource-policies/{name}`` | ``{name, default_for_unspecified, total_resource_slots, max_concurrent_sessions, max_pending_session_count, max_pending_session_resource_slots, idle_timeout, max_vfolder_count, max_vfolder_size}`` | policy |
| ``GET/POST /admin/scaling-groups``, ``PATCH/DELETE /admin/scaling-groups/{name}`` | ``{name, description, is_active, is_public, scheduler, scheduler_opts, default_session_slots}`` | scaling group |
| ``GET /admin/scaling-groups/{name}/associations`` | | ``{"domains": [name], "groups": [id], "keypairs": [access_key]}`` |
| ``POST /admin/scaling-groups/{name}/associations`` | exactly one of ``{domain, group, access_key}`` (``group``: a project's id) | the associations after it (idempotent) |
| ``DELETE /admin/scaling-groups/{name}/associations?domain=`` (or ``group=``, ``access_key=``) | | the associations after it (idempotent) |

Slot amounts are user input (``{"cpu": "4", "mem": "8g", "cuda.shares": "inf"}``),
parsed against the known slot types; ``Infinity``/``inf`` means unlimited.  The routes
validate the bodies and call :class:`~accelshare.manager.services.admin.AdminService`,
which reads and writes the database.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from accelshare.common import DefaultForUnspecified
from accelshare.common.text_input import check_text
from accelshare.manager.enums import UserRole, UserStatus
from accelshare.manager.errors import InvalidRequest
from accelshare.manager.services.admin import (
    KeypairChanges,
    NewKeypair,
    NewUser,
    PolicyChanges,
    ScalingGroupChanges,
    UserChanges,
)
from accelshare.manager.services.scaling_group_access import AssociationKind

from .auth import AdminIdentity, SuperadminIdentity
from .deps import UNFROZEN, ManagerDep

__all__ = ["router"]

router = APIRouter(prefix="/admin", tags=["admin"])


# -- users ----------------------------------------------------------------------------------


def _single_line(value: str | None, info: ValidationInfo) -> str | None:
    """E-mail addresses and names: no NUL or control character (a ``ValueError`` naming
    the field, the character and its position)."""
    return None if value is None else check_text(value, field=str(info.field_name))


class CreateUserBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str = Field(min_length=3, max_length=128, pattern=r"^[^@\s]+@[^@\s]+$")
    password: str = Field(min_length=8, max_length=1024)
    username: str | None = Field(default=None, max_length=64)
    full_name: str = Field(default="", max_length=128)
    role: UserRole = UserRole.USER
    domain_name: str | None = None
    group: str | None = None
    resource_policy: str = "default"
    with_keypair: bool = True

    @field_validator("email", "username", "full_name")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


class PatchUserBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    password: str | None = Field(default=None, min_length=8, max_length=1024)
    role: UserRole | None = None
    status: UserStatus | None = None
    full_name: str | None = Field(default=None, max_length=128)
    total_resource_slots: dict[str, Any] | None = None

    @field_validator("full_name")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


@router.get("/users")
async def list_users(
    identity: AdminIdentity, manager: ManagerDep, domain: str | None = None
) -> dict[str, Any]:
    return {"items": await manager.admin.list_users(identity, domain)}


@router.post("/users", status_code=201, dependencies=[UNFROZEN])
async def create_user(
    body: CreateUserBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.create_user(identity, NewUser(**body.model_dump()))


@router.patch("/users/{email}", dependencies=[UNFROZEN])
async def patch_user(
    email: str, body: PatchUserBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    changes = UserChanges(**body.model_dump())
    return {"user": await manager.admin.patch_user(identity, email, changes)}


@router.delete("/users/{email}", dependencies=[UNFROZEN])
async def delete_user(email: str, identity: AdminIdentity, manager: ManagerDep) -> dict[str, Any]:
    return {"user": await manager.admin.delete_user(identity, email)}


# -- keypairs -------------------------------------------------------------------------------


class CreateKeypairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_email: str
    resource_policy: str = "default"
    is_active: bool = True
    is_admin: bool = False

    @field_validator("user_email")
    @classmethod
    def _one_line(cls, value: str, info: ValidationInfo) -> str | None:
        return _single_line(value, info)


class PatchKeypairBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    is_active: bool | None = None
    is_admin: bool | None = None
    resource_policy: str | None = None


@router.get("/keypairs")
async def list_keypairs(
    identity: AdminIdentity, manager: ManagerDep, user_email: str | None = None
) -> dict[str, Any]:
    return {"items": await manager.admin.list_keypairs(identity, user_email)}


@router.post("/keypairs", status_code=201, dependencies=[UNFROZEN])
async def create_keypair(
    body: CreateKeypairBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.create_keypair(identity, NewKeypair(**body.model_dump()))


@router.patch("/keypairs/{access_key}", dependencies=[UNFROZEN])
async def patch_keypair(
    access_key: str, body: PatchKeypairBody, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    changes = KeypairChanges(**body.model_dump())
    return await manager.admin.patch_keypair(identity, access_key, changes)


@router.delete("/keypairs/{access_key}", dependencies=[UNFROZEN])
async def delete_keypair(
    access_key: str, identity: AdminIdentity, manager: ManagerDep
) -> dict[str, str]:
    await manager.admin.delete_keypair(identity, access_key)
    return {"result": "deleted"}


# -- resource policies ----------------------------------------------------------------------


INT32_MAX = 2**31 - 1


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=64)
    default_for_unspecified: DefaultForUnspecified | None = None
    total_resource_slots: dict[str, Any] | None = None
    # le: the columns are 32-bit INTEGERs (a larger value was a 500; docs/reliability.md)
    max_concurrent_sessions: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_pending_session_count: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_pending_session_resource_slots: dict[str, Any] | None = None
    clear_max_pending_session_resource_slots: bool = False
    idle_timeout: int | None = Field(default=None, ge=0, le=INT32_MAX)
    # storage folders (docs/folders.md): per user, and bytes per folder (a BIGINT)
    max_vfolder_count: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_vfolder_size: int | None = Field(default=None, ge=0, le=2**63 - 1)


@router.get("/resource-policies")
async def list_policies(_identity: SuperadminIdentity, manager: ManagerDep) -> dict[str, Any]:
    return {"items": await manager.admin.list_policies()}


@router.post("/resource-policies", status_code=201, dependencies=[UNFROZEN])
async def create_policy(
    body: PolicyBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.create_policy(PolicyChanges(**body.model_dump()))


@router.patch("/resource-policies/{name}", dependencies=[UNFROZEN])
async def patch_policy(
    name: str, body: PolicyBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.patch_policy(name, PolicyChanges(**body.model_dump()))


@router.delete("/resource-policies/{name}", dependencies=[UNFROZEN])
async def delete_policy(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    await manager.admin.delete_policy(name)
    return {"result": "deleted"}


# -- scaling groups -------------------------------------------------------------------------
# ``name=`` keeps the routes' public names (their OpenAPI operation ids and summaries).


class ScalingGroupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    description: str | None = Field(default=None, max_length=512)
    is_active: bool | None = None
    is_public: bool | None = None
    scheduler: Literal["fifo", "lifo", "drf"] | None = None
    scheduler_opts: dict[str, Any] | None = None
    default_session_slots: dict[str, Any] | None = None


@router.get("/scaling-groups", name="list_sgroups")
async def list_scaling_groups(_identity: SuperadminIdentity, manager: ManagerDep) -> dict[str, Any]:
    return {"items": await manager.admin.list_scaling_groups()}


@router.post("/scaling-groups", status_code=201, name="create_sgroup", dependencies=[UNFROZEN])
async def create_scaling_group(
    body: ScalingGroupBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.create_scaling_group(ScalingGroupChanges(**body.model_dump()))


@router.patch("/scaling-groups/{name}", name="patch_sgroup", dependencies=[UNFROZEN])
async def patch_scaling_group(
    name: str, body: ScalingGroupBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.admin.patch_scaling_group(name, ScalingGroupChanges(**body.model_dump()))


@router.delete("/scaling-groups/{name}", name="delete_sgroup", dependencies=[UNFROZEN])
async def delete_scaling_group(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    await manager.admin.delete_scaling_group(name)
    return {"result": "deleted"}


class AssociationBody(BaseModel):
    """What to open a scaling group to: exactly one of a domain, a project (group) id or
    an access key."""

    model_config = ConfigDict(extra="forbid")

    domain: str | None = Field(default=None, min_length=1, max_length=64)
    group: str | None = Field(default=None, min_length=1, max_length=64)
    access_key: str | None = Field(default=None, min_length=1, max_length=64)


def _association(body: AssociationBody) -> tuple[AssociationKind, str]:
    given = [
        (kind, value)
        for kind, value in (
            (AssociationKind.DOMAIN, body.domain),
            (AssociationKind.GROUP, body.group),
            (AssociationKind.KEYPAIR, body.access_key),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise InvalidRequest(
            "Name exactly one of domain, group or access_key",
            field="domain|group|access_key",
            expected="exactly one of them",
            received=body.model_dump(exclude_none=True),
        )
    return given[0]


@router.get("/scaling-groups/{name}/associations", name="list_sgroup_associations")
async def list_scaling_group_associations(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, list[str]]:
    return await manager.scaling_group_access.associations(name)


@router.post("/scaling-groups/{name}/associations", name="associate_sgroup")
async def associate_scaling_group(
    name: str, body: AssociationBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, list[str]]:
    kind, target = _association(body)
    await manager.scaling_group_access.associate(kind, name, target)
    return await manager.scaling_group_access.associations(name)


@router.delete("/scaling-groups/{name}/associations", name="dissociate_sgroup")
async def dissociate_scaling_group(
    name: str,
    _identity: SuperadminIdentity,
    manager: ManagerDep,
    domain: str | None = None,
    group: str | None = None,
    access_key: str | None = None,
) -> dict[str, list[str]]:
    kind, target = _association(AssociationBody(domain=domain, group=group, access_key=access_key))
    await manager.scaling_group_access.dissociate(kind, name, target)
    return await manager.scaling_group_access.associations(name)
