"""``client.admin``: users, keypairs, resource policies, scaling groups, config tree.

Admins manage users and keypairs of their domain, superadmins everything.  The
answers are typed (:mod:`.models`): :class:`UserInfo`, :class:`KeypairInfo`,
:class:`CreatedUser`, :class:`ResourcePolicyInfo`, :class:`ScalingGroupInfo`; quotas
are ``Decimal`` (``Decimal("Infinity")`` = unlimited) and ``.to_json()`` gives the
server's object back.  A new keypair's ``secret_key`` is only ever in the answer that
created it.  Slot amounts sent are user input (``{"cpu": "4", "mem": "8g",
"cuda.shares": "inf"}``; ``inf`` = unlimited).  Deletes return nothing (an error if
refused).  The configuration tree stays plain JSON (``str`` values, nested ``dict``).

Update methods send only the fields given (``None`` = leave as is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

from .http import HttpCaller
from .models import (
    CreatedUser,
    KeypairInfo,
    ResourcePolicyInfo,
    ScalingGroupAssociations,
    ScalingGroupInfo,
    UserInfo,
)

__all__ = ["AdminAPI"]

M = TypeVar("M", bound=BaseModel)


def _given(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _items(answer: Any, model: type[M]) -> list[M]:
    return [model.model_validate(item) for item in answer.get("items", [])]


class AdminAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    # -- users ----------------------------------------------------------------------------
    async def list_users(self, *, domain: str | None = None) -> list[UserInfo]:
        answer = await self._http.request("GET", "/admin/users", params={"domain": domain})
        return _items(answer, UserInfo)

    async def create_user(
        self,
        email: str,
        password: str,
        *,
        username: str | None = None,
        full_name: str | None = None,
        role: str | None = None,
        domain_name: str | None = None,
        group: str | None = None,
        resource_policy: str | None = None,
        with_keypair: bool = True,
    ) -> CreatedUser:
        """The user, and its keypair (with the secret key) unless ``with_keypair=False``."""
        body = _given(
            email=email,
            password=password,
            username=username,
            full_name=full_name,
            role=role,
            domain_name=domain_name,
            group=group,
            resource_policy=resource_policy,
        )
        body["with_keypair"] = with_keypair
        answer = await self._http.request("POST", "/admin/users", json_body=body)
        return CreatedUser.model_validate(answer)

    async def update_user(
        self,
        email: str,
        *,
        password: str | None = None,
        role: str | None = None,
        status: str | None = None,
        full_name: str | None = None,
        total_resource_slots: Mapping[str, str] | None = None,
    ) -> UserInfo:
        body = _given(
            password=password,
            role=role,
            status=status,
            full_name=full_name,
            total_resource_slots=dict(total_resource_slots)
            if total_resource_slots is not None
            else None,
        )
        answer = await self._http.request("PATCH", f"/admin/users/{quote(email)}", json_body=body)
        return UserInfo.model_validate(answer["user"])

    async def delete_user(self, email: str) -> UserInfo:
        """Marks the user deleted and deactivates its keypairs; returns it (status
        ``deleted``)."""
        answer = await self._http.request("DELETE", f"/admin/users/{quote(email)}")
        return UserInfo.model_validate(answer["user"])

    # -- keypairs -------------------------------------------------------------------------
    async def list_keypairs(self, *, user_email: str | None = None) -> list[KeypairInfo]:
        answer = await self._http.request(
            "GET", "/admin/keypairs", params={"user_email": user_email}
        )
        return _items(answer, KeypairInfo)

    async def create_keypair(
        self,
        user_email: str,
        *,
        resource_policy: str | None = None,
        is_active: bool = True,
        is_admin: bool = False,
    ) -> KeypairInfo:
        """The new keypair, with its ``secret_key`` (shown this once)."""
        body = _given(user_email=user_email, resource_policy=resource_policy)
        body.update(is_active=is_active, is_admin=is_admin)
        answer = await self._http.request("POST", "/admin/keypairs", json_body=body)
        return KeypairInfo.model_validate(answer)

    async def update_keypair(
        self,
        access_key: str,
        *,
        is_active: bool | None = None,
        is_admin: bool | None = None,
        resource_policy: str | None = None,
    ) -> KeypairInfo:
        body = _given(is_active=is_active, is_admin=is_admin, resource_policy=resource_policy)
        path = f"/admin/keypairs/{quote(access_key)}"
        return KeypairInfo.model_validate(await self._http.request("PATCH", path, json_body=body))

    async def delete_keypair(self, access_key: str) -> None:
        """Refused (409) while sessions reference the keypair: deactivate it instead."""
        await self._http.request("DELETE", f"/admin/keypairs/{quote(access_key)}")

    # -- resource policies ----------------------------------------------------------------
    async def list_policies(self) -> list[ResourcePolicyInfo]:
        answer = await self._http.request("GET", "/admin/resource-policies")
        return _items(answer, ResourcePolicyInfo)

    async def create_policy(self, name: str, **fields: Any) -> ResourcePolicyInfo:
        """Fields: ``default_for_unspecified`` (LIMITED/UNLIMITED), ``total_resource_slots``,
        ``max_concurrent_sessions``, ``max_pending_session_count``,
        ``max_pending_session_resource_slots``, ``idle_timeout``."""
        body = {"name": name, **_given(**fields)}
        answer = await self._http.request("POST", "/admin/resource-policies", json_body=body)
        return ResourcePolicyInfo.model_validate(answer)

    async def update_policy(self, name: str, **fields: Any) -> ResourcePolicyInfo:
        path = f"/admin/resource-policies/{quote(name)}"
        answer = await self._http.request("PATCH", path, json_body=_given(**fields))
        return ResourcePolicyInfo.model_validate(answer)

    async def delete_policy(self, name: str) -> None:
        """Refused (409) while keypairs use the policy."""
        await self._http.request("DELETE", f"/admin/resource-policies/{quote(name)}")

    # -- scaling groups -------------------------------------------------------------------
    async def list_scaling_groups(self) -> list[ScalingGroupInfo]:
        answer = await self._http.request("GET", "/admin/scaling-groups")
        return _items(answer, ScalingGroupInfo)

    async def create_scaling_group(self, name: str, **fields: Any) -> ScalingGroupInfo:
        """Fields: ``description``, ``is_active``, ``is_public``, ``scheduler``
        (fifo/lifo/drf), ``scheduler_opts``, ``default_session_slots``."""
        body = {"name": name, **_given(**fields)}
        answer = await self._http.request("POST", "/admin/scaling-groups", json_body=body)
        return ScalingGroupInfo.model_validate(answer)

    async def update_scaling_group(self, name: str, **fields: Any) -> ScalingGroupInfo:
        path = f"/admin/scaling-groups/{quote(name)}"
        answer = await self._http.request("PATCH", path, json_body=_given(**fields))
        return ScalingGroupInfo.model_validate(answer)

    async def delete_scaling_group(self, name: str) -> None:
        """Refused (409) while agents or sessions reference the group."""
        await self._http.request("DELETE", f"/admin/scaling-groups/{quote(name)}")

    async def scaling_group_associations(self, name: str) -> ScalingGroupAssociations:
        """The domains, projects (group ids) and access keys that may use ``name``."""
        path = f"/admin/scaling-groups/{quote(name)}/associations"
        return ScalingGroupAssociations.model_validate(await self._http.request("GET", path))

    async def associate_scaling_group(
        self,
        name: str,
        *,
        domain: str | None = None,
        group: str | None = None,
        access_key: str | None = None,
    ) -> ScalingGroupAssociations:
        """Open ``name`` to one domain, project (group id) or access key (idempotent)."""
        path = f"/admin/scaling-groups/{quote(name)}/associations"
        body = _given(domain=domain, group=group, access_key=access_key)
        answer = await self._http.request("POST", path, json_body=body)
        return ScalingGroupAssociations.model_validate(answer)

    async def dissociate_scaling_group(
        self,
        name: str,
        *,
        domain: str | None = None,
        group: str | None = None,
        access_key: str | None = None,
    ) -> ScalingGroupAssociations:
        """Close ``name`` to one domain, project (group id) or access key (idempotent)."""
        path = f"/admin/scaling-groups/{quote(name)}/associations"
        params = {"domain": domain, "group": group, "access_key": access_key}
        answer = await self._http.request("DELETE", path, params=params)
        return ScalingGroupAssociations.model_validate(answer)

    # -- configuration tree (superadmin); scaling_group goes as ``sgroup`` on the wire ---
    async def etcd_get(
        self,
        key: str,
        *,
        scope: str | None = None,
        scaling_group: str | None = None,
        node: str | None = None,
    ) -> str | None:
        params = {"key": key, "scope": scope, "sgroup": scaling_group, "node": node}
        answer = await self._http.request("GET", "/admin/etcd", params=params)
        value = answer.get("value")
        return None if value is None else str(value)

    async def etcd_get_prefix(
        self,
        prefix: str,
        *,
        scope: str | None = None,
        scaling_group: str | None = None,
        node: str | None = None,
    ) -> dict[str, Any]:
        params = {"prefix": prefix, "scope": scope, "sgroup": scaling_group, "node": node}
        answer = await self._http.request("GET", "/admin/etcd", params=params)
        return dict(answer.get("tree") or {})

    async def etcd_put(
        self,
        key: str,
        value: str,
        *,
        scope: str | None = None,
        scaling_group: str | None = None,
        node: str | None = None,
    ) -> None:
        body = _given(key=key, value=value, scope=scope, sgroup=scaling_group, node=node)
        await self._http.request("PUT", "/admin/etcd", json_body=body)

    async def etcd_put_tree(
        self,
        prefix: str,
        tree: Mapping[str, Any],
        *,
        replace: bool = False,
        scope: str | None = None,
        scaling_group: str | None = None,
        node: str | None = None,
    ) -> None:
        body = _given(prefix=prefix, tree=dict(tree), scope=scope, sgroup=scaling_group, node=node)
        body["replace"] = replace
        await self._http.request("PUT", "/admin/etcd", json_body=body)

    async def etcd_delete(
        self,
        key: str,
        *,
        prefix: bool = False,
        scope: str | None = None,
        scaling_group: str | None = None,
        node: str | None = None,
    ) -> None:
        """Delete a key (``prefix=True``: the key, its own value and its subtree)."""
        params = {
            "prefix" if prefix else "key": key,
            "scope": scope,
            "sgroup": scaling_group,
            "node": node,
        }
        await self._http.request("DELETE", "/admin/etcd", params=params)
