"""The session-creation request as the session service takes it, and its validation
at enqueue (spec 05 "Requests", 07).

:class:`SessionRequest` is a plain value: the API reads and checks ``POST /session``'s
body (:mod:`accelshare.api.schemas.sessions`, Backend.AI's spellings included) and
converts it.

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
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

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

from .errors import InvalidRequest
from .models.sessions import DEFAULT_PRIORITY, MAX_PRIORITY

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "SERVICE_NAME_RE",
    "SERVICE_PORT_ENV_PREFIX",
    "ServicePort",
    "SessionConfig",
    "SessionRequest",
    "app_services",
    "resolve_resources",
    "service_ports_from_environ",
]

SERVICE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
SERVICE_PORT_ENV_PREFIX = "BACKENDAI_SERVICE_PORT_"


@dataclass(frozen=True)
class ServicePort:
    """One app service a session offers (``config.service_ports``).

    Kept in the session's environment as ``BACKENDAI_SERVICE_PORT_<NAME>=<port>`` (the
    name upper-cased; this is also how a kernel learns its ports).  The agent gives each
    one a host port of its own from ``[container] port-range``
    (:mod:`accelshare.agent.ports`), and the manager proxies
    ``/session/{id}/apps/{name}/...`` there (HTTP and WebSocket).
    :func:`service_ports_from_environ` reads them back, :func:`app_services` adds the
    host ports."""

    name: str
    protocol: str
    port: int

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
        if key.startswith(SERVICE_PORT_ENV_PREFIX) and SERVICE_NAME_RE.match(name):
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


@dataclass(frozen=True)
class SessionConfig:
    """``config`` of a request: the amounts as sent (parsed by :func:`resolve_resources`)."""

    resources: Mapping[str, Any] = field(default_factory=dict)
    resource_opts: Mapping[str, Any] = field(default_factory=dict)
    scaling_group: str | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    agent_list: tuple[str, ...] | None = None
    service_ports: tuple[ServicePort, ...] = ()


@dataclass(frozen=True)
class SessionRequest:
    """A session to enqueue, as :meth:`SessionService.create
    <accelshare.manager.sessions.SessionService.create>` takes it (the API's
    ``CreateSessionBody`` has checked the names, texts and ranges)."""

    image: str
    name: str | None = None
    type: Literal["interactive", "batch"] = "interactive"
    config: SessionConfig = field(default_factory=SessionConfig)
    priority: int = DEFAULT_PRIORITY
    starts_at: datetime | None = None
    dependencies: tuple[str, ...] = ()
    enqueue_only: bool = False
    wait_for_agents: bool = False
    max_wait_seconds: int = 0
    startup_command: str | None = None
    group: str | None = None
    reuse_if_exists: bool = False
    owner_access_key: str | None = None


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
