"""The session-creation request and its validation at enqueue (spec 05 "Requests", 07).

``POST /session`` takes spec 07's body; Backend.AI's client sends the same with a few
other spellings (``config.scaling_group``, ``startsAt``, ``clientSessionToken``...),
accepted as aliases.  Unknown fields are ignored (the official client sends more).

:func:`resolve_resources` is the pure part of the validation, given what the agents
reported (known slot types, quanta, discrete slots):

* ``ResourceSlot.from_user_input`` against the known set: a non-zero unknown slot is
  refused ("Unknown requested resource slot: ...");
* missing ``cpu`` / ``mem`` come from the scaling group's defaults; both must end up
  positive;
* every amount is read exactly as written (:func:`accelshare.common.parse_amount`):
  a count must be a multiple of a quantum its agents report, or of 0.001 when no
  agent of the scaling group reports one; off the grid it is refused with the nearest
  valid amounts (``NotMultipleOfQuantum``), below one quantum too
  (``BelowOneQuantum``), never rounded; a discrete slot's amount must be a whole
  number; a unique slot's exactly 1.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping, Sequence, Set
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from accelshare.common import (
    BelowOneQuantum,
    CommonValueError,
    NotMultipleOfQuantum,
    ResourceSlot,
    SlotTypes,
    UnknownResourceSlotType,
    canonical_decimal,
    grid_neighbours,
)
from accelshare.common.text_input import check_env_name, check_text

from .errors import InvalidRequest
from .models.sessions import DEFAULT_PRIORITY, MAX_PRIORITY

__all__ = [
    "CreateSessionBody",
    "ServicePortBody",
    "SessionConfigBody",
    "app_services",
    "resolve_resources",
    "service_ports_from_environ",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _aliases(*names: str) -> AliasChoices:
    return AliasChoices(*names)


_SERVICE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
SERVICE_PORT_ENV_PREFIX = "BACKENDAI_SERVICE_PORT_"


class ServicePortBody(BaseModel):
    """One app service a session offers (``config.service_ports``).

    Until images declare their services (the image catalogue), the session's creator
    declares them.  They are kept in the session's environment, as
    ``BACKENDAI_SERVICE_PORT_<NAME>=<port>`` (the name upper-cased; this is also how a
    kernel learns its ports).  The agent gives each one a host port of its own from
    ``[container] port-range`` (:mod:`accelshare.agent.ports`: the process runtime's
    kernel listens on it, its variable rewritten; a docker bridge container keeps the
    declared port, published on it), and the manager proxies
    ``/session/{id}/apps/{name}/...`` there (HTTP and WebSocket).
    :func:`service_ports_from_environ` reads them back, :func:`app_services` adds the
    host ports."""

    model_config = ConfigDict(extra="forbid")

    name: str
    protocol: Literal["http"] = "http"
    port: int = Field(ge=1024, le=65535)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _SERVICE_NAME_RE.fullmatch(value):
            raise ValueError(
                "a service name is 1-32 lower-case letters, digits or '_', starting with a letter"
            )
        return value

    @property
    def env_name(self) -> str:
        return SERVICE_PORT_ENV_PREFIX + self.name.upper()


def service_ports_from_environ(environ: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """``[{"name", "protocol", "port"}]`` declared in a session's environment, by name.

    >>> service_ports_from_environ({"BACKENDAI_SERVICE_PORT_WEB": "8080", "X": "1"})
    [{'name': 'web', 'protocol': 'http', 'port': 8080}]
    """
    found = []
    for key, value in (environ or {}).items():
        name = key[len(SERVICE_PORT_ENV_PREFIX) :].lower()
        if key.startswith(SERVICE_PORT_ENV_PREFIX) and _SERVICE_NAME_RE.match(name):
            with contextlib.suppress(ValueError):
                found.append({"name": name, "protocol": "http", "port": int(value)})
    return sorted(found, key=lambda s: str(s["name"]))


def app_services(
    environ: Mapping[str, str] | None, kernel_ports: Sequence[Any] | None
) -> list[dict[str, Any]]:
    """The declared services (:func:`service_ports_from_environ`), each with the
    ``hostPort`` its agent gave it (``[container] port-range``; the kernel's
    ``service_ports`` as the agent reported them), where known.

    >>> app_services({"BACKENDAI_SERVICE_PORT_WEB": "8080"},
    ...              [{"name": "web", "container_port": 8080, "host_port": 30001}])
    [{'name': 'web', 'protocol': 'http', 'port': 8080, 'hostPort': 30001}]
    """
    hosts: dict[str, int] = {}
    for item in kernel_ports or ():
        if isinstance(item, Mapping) and isinstance(item.get("host_port"), int):
            hosts[str(item.get("name"))] = int(item["host_port"])
    return [
        {**s, "hostPort": hosts[s["name"]]} if s["name"] in hosts else s
        for s in service_ports_from_environ(environ)
    ]


class SessionConfigBody(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    # Any: the amounts are parsed (exactly, or refused by name) by resolve_resources;
    # a narrower type here would let pydantic turn a JSON ``true`` into 1.
    resources: dict[str, Any] = Field(default_factory=dict)
    resource_opts: dict[str, Any] = Field(
        default_factory=dict, validation_alias=_aliases("resource_opts", "resourceOpts")
    )
    scaling_group: str | None = Field(
        default=None, validation_alias=_aliases("scalingGroup", "scaling_group")
    )
    environ: dict[str, str] = Field(default_factory=dict)
    agent_list: list[str] | None = Field(
        default=None, validation_alias=_aliases("agentList", "agent_list")
    )
    service_ports: list[ServicePortBody] = Field(
        default_factory=list,
        max_length=16,
        validation_alias=_aliases("service_ports", "servicePorts"),
    )

    @field_validator("environ")
    @classmethod
    def _check_environ(cls, value: dict[str, str]) -> dict[str, str]:
        """POSIX names the agent does not set; values without NUL or control characters
        (tabs and line breaks allowed).  :mod:`accelshare.common.text_input`."""
        for name, text in value.items():
            check_env_name(name, field=f"config.environ.{name}")
            check_text(text, field=f"config.environ.{name}", multiline=True)
        return value

    @field_validator("service_ports")
    @classmethod
    def _unique_services(cls, value: list[ServicePortBody]) -> list[ServicePortBody]:
        names: list[object] = [s.name for s in value]
        ports: list[object] = [s.port for s in value]
        for label, seen in (("name", names), ("port", ports)):
            dup = next((x for x in seen if seen.count(x) > 1), None)
            if dup is not None:
                raise ValueError(f"two services with the {label} {dup!r}: each must be unique")
        return value


class CreateSessionBody(BaseModel):
    """``POST /session`` (spec 07; Backend.AI's spellings accepted)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    image: str = Field(min_length=1, max_length=512, validation_alias=_aliases("image", "lang"))
    name: str | None = Field(
        default=None,
        validation_alias=_aliases("name", "sessionName", "clientSessionToken"),
    )
    type: Literal["interactive", "batch"] = Field(
        default="interactive", validation_alias=_aliases("type", "sessionType", "session_type")
    )
    config: SessionConfigBody = Field(default_factory=SessionConfigBody)
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=MAX_PRIORITY)
    starts_at: datetime | None = Field(
        default=None, validation_alias=_aliases("starts_at", "startsAt")
    )
    dependencies: list[str] = Field(default_factory=list)
    enqueue_only: bool = Field(
        default=False, validation_alias=_aliases("enqueueOnly", "enqueue_only")
    )
    # Keep a session no agent of its scaling group could hold even when empty (it is
    # refused otherwise): it waits, saying so, for an agent that can to join.
    wait_for_agents: bool = Field(
        default=False, validation_alias=_aliases("waitForAgents", "wait_for_agents")
    )
    max_wait_seconds: int = Field(
        default=0, ge=0, le=3600, validation_alias=_aliases("maxWaitSeconds", "max_wait_seconds")
    )
    startup_command: str | None = Field(
        default=None,
        max_length=16384,
        validation_alias=_aliases("startupCommand", "startup_command"),
    )
    group: str | None = Field(default=None, validation_alias=_aliases("group", "groupName"))
    reuse_if_exists: bool = Field(
        default=False, validation_alias=_aliases("reuseIfExists", "reuse_if_exists")
    )
    owner_access_key: str | None = Field(
        default=None, validation_alias=_aliases("owner_access_key", "ownerAccessKey")
    )
    cluster_size: int = Field(default=1, validation_alias=_aliases("cluster_size", "clusterSize"))

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                "a session name is 1-64 letters, digits, '.', '_' or '-', starting with a"
                " letter or digit"
            )
        try:
            uuid.UUID(value)
        except ValueError:
            return value
        raise ValueError("a session name must not look like a session id (a UUID)")

    @field_validator("startup_command")
    @classmethod
    def _check_startup_command(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, field="startupCommand", multiline=True)

    @field_validator("starts_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("cluster_size")
    @classmethod
    def _single_node(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only single-kernel sessions are supported (cluster_size = 1)")
        return value


def _field(slot: str) -> str:
    return f"config.resources.{slot}"


def resolve_resources(
    raw: Mapping[str, Any],
    *,
    known: Mapping[str, SlotTypes],
    defaults: ResourceSlot,
    quanta: Mapping[str, Set[Decimal]],
    discrete: Set[str],
) -> ResourceSlot:
    """Parse and check a request's resources (see the module docstring).

    ``quanta``: fractional slot -> the quanta agents report for it (a request must be a
    multiple of one of them); ``discrete``: slots only whole units can be given of.
    Raises :class:`~accelshare.manager.errors.InvalidRequest` naming the field and value.
    """
    try:
        parsed = ResourceSlot.from_user_input(raw, known, quanta=quanta)
    except UnknownResourceSlotType as e:
        slot = e.slot
        hint = (
            " (shmem is a resource option: put it in config.resource_opts)"
            if slot == "shmem"
            else ""
        )
        raise InvalidRequest(
            f"Unknown requested resource slot: {slot}{hint} (slots known in this cluster:"
            f" {', '.join(known)})",
            field=_field(slot),
            expected="a slot some agent reports: " + ", ".join(known),
            received=raw.get(slot),
        ) from None
    except NotMultipleOfQuantum as e:
        raise InvalidRequest(
            str(e),
            field=_field(e.field),
            expected=e.expected,
            received=raw.get(e.field, e.received),
            error="BelowOneQuantum" if isinstance(e, BelowOneQuantum) else "NotMultipleOfQuantum",
            quantum=canonical_decimal(e.quantum),
            nearest=[canonical_decimal(e.lower), canonical_decimal(e.upper)],
        ) from None
    except CommonValueError as e:
        slot = e.field or "?"
        raise InvalidRequest(
            f"Invalid amount for {slot}: {e}",
            field=_field(slot),
            expected=e.expected,
            received=raw.get(slot, e.received),
        ) from None
    values = dict(parsed.items())
    for slot in ("cpu", "mem"):
        if slot not in raw:
            values[slot] = defaults.get_amount(slot)
    resolved = ResourceSlot(values)
    for slot in ("cpu", "mem"):
        if resolved.get_amount(slot) <= 0:
            raise InvalidRequest(
                f"{slot} must be positive (received {raw.get(slot, 0)!r})",
                field=_field(slot),
                expected="an amount > 0",
                received=raw.get(slot, 0),
            )
    for slot, amount in resolved.items():
        if amount <= 0:
            continue
        shown = canonical_decimal(amount)
        if not amount.is_finite():
            raise InvalidRequest(
                f"{slot} must be a finite amount (received {raw.get(slot)!r})",
                field=_field(slot),
                expected="a finite amount",
                received=raw.get(slot),
            )
        if known.get(slot) is SlotTypes.UNIQUE and amount != 1:
            raise InvalidRequest(
                f"{slot} is a unique slot (a device taken whole): request exactly 1"
                f" (received {shown})",
                field=_field(slot),
                expected="exactly 1",
                received=raw.get(slot),
            )
        if slot in discrete and amount != amount.to_integral_value():
            lower, upper = grid_neighbours(amount, Decimal(1))
            raise InvalidRequest(
                f"{slot}={shown} must be a whole number (nearest whole amounts:"
                f" {canonical_decimal(lower)} and {canonical_decimal(upper)})",
                field=_field(slot),
                expected="a whole number",
                received=raw.get(slot),
            )
    return resolved
