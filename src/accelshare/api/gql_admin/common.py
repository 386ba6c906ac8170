"""What every part of the admin GraphQL shares: the caller and its role, page sizes,
JSON-string inputs, ``{ ok msg }``, the settings accelshare does not keep and the
features it refuses.

What accelshare does not keep (``need_password_change``, ``allowed_client_ip``, a
scaling group's ``driver``, a policy's ``max_session_lifetime``...) reads as ``null``; an
input that asks for a value of such a setting other than its "off" value is refused
with an error naming the field (:func:`not_kept`), so nothing is silently dropped; the
exceptions are the limits accelshare does not apply (``allowed_vfolder_hosts``: every
user may use every configured storage host, :func:`vacuous`;
``max_concurrent_sftp_sessions``: no SFTP sessions) and a keypair's ``rate_limit`` (the
client always sends one), which are accepted without being kept.  A Backend.AI feature
accelshare does not have is a :class:`NotSupportedByAccelshare` error that says what to
use instead.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import strawberry
from strawberry.types import Info

from accelshare.manager.runtime import Manager

from ..auth import Identity
from ..gql_limits import MAX_PAGE_SIZE

__all__ = [
    "Done",
    "NotSupportedByAccelshare",
    "check_page",
    "context",
    "done",
    "json_input",
    "json_text",
    "not_kept",
    "refuse",
    "require_admin",
    "require_superadmin",
    "superadmin_manager",
    "uuids",
    "vacuous",
]

_MAX_OFFSET = 2**31 - 1  # past SQL's range


def check_page(query: str, limit: int, offset: int) -> None:
    """Page sizes are capped like REST's (``GET /sessions?limit=``)."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(
            f"{query}(limit): expected an integer from 1 to {MAX_PAGE_SIZE}, received {limit}"
        )
    if not 0 <= offset <= _MAX_OFFSET:
        raise ValueError(
            f"{query}(offset): expected an integer from 0 to {_MAX_OFFSET}, received {offset}"
        )


def context(info: Info) -> tuple[Manager, Identity]:
    ctx = info.context
    return ctx["manager"], ctx["identity"]


def require_admin(identity: Identity) -> None:
    if not identity.is_admin:
        raise PermissionError(f"This needs the admin role; {identity.email} has {identity.role}")


def require_superadmin(identity: Identity) -> None:
    if not identity.is_superadmin:
        raise PermissionError(
            f"This needs the superadmin role; {identity.email} has {identity.role}"
        )


def json_text(value: Any) -> str:
    return json.dumps(value)


def json_input(raw: str | None, field: str) -> dict[str, Any] | None:
    """A JSON-object input (Backend.AI's ``JSONString``)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"{field}: expected a JSON object (a string), received {raw!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected a JSON object, received {raw!r}")
    return value


def vacuous(field: str, raw: str | None) -> None:
    """``allowed_vfolder_hosts``: accelshare does not restrict storage hosts per domain,
    project or policy (every configured host is usable, docs/folders.md), so a
    permission on them is accepted (a JSON object) without being kept."""
    json_input(raw, field)


def not_kept(field: str, value: Any, *off: Any) -> None:
    """Refuse a setting accelshare does not keep unless it is null or its "off" value."""
    if value is None or any(value == o for o in off):
        return
    allowed = " or ".join(repr(o) for o in (None, *off))
    raise ValueError(
        f"{field}: accelshare does not keep this setting; expected {allowed},"
        f" received {value!r} (see docs/compatibility.md)"
    )


@strawberry.type(name="SimpleMutationResult")
class Done:
    """``{ ok msg }`` of the mutations that answer nothing else."""

    ok: bool
    msg: str


def done(what: str) -> Done:
    return Done(ok=True, msg=f"{what}: done")


def uuids(raw: list[str] | None, field: str) -> list[uuid.UUID]:
    found = []
    for value in raw or []:
        try:
            found.append(uuid.UUID(value))
        except ValueError:
            raise ValueError(f"{field}: expected UUIDs, received {value!r}") from None
    return found


class NotSupportedByAccelshare(ValueError):
    """A Backend.AI feature accelshare does not have (a GraphQL error, not a bug)."""

    def __init__(self, feature: str, instead: str) -> None:
        super().__init__(
            f"Not supported by accelshare: {feature}. {instead} (see docs/compatibility.md)"
        )


def superadmin_manager(info: Info) -> Manager:
    """The manager, for a superadmin caller (anyone else: a ``PermissionError``)."""
    manager, identity = context(info)
    require_superadmin(identity)
    return manager


def refuse(feature: str, instead: str) -> NotSupportedByAccelshare:
    return NotSupportedByAccelshare(feature, instead)
