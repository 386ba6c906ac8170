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
import uuid
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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
from accelshare.protocol.agent_rpc import KernelMount

from ...errors import InvalidRequest
from ...models.sessions import DEFAULT_PRIORITY, MAX_PRIORITY

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "SERVICE_NAME_RE",
    "SERVICE_PORTS_LABEL",
    "SERVICE_PORT_ENV_PREFIX",
    "SESSION_NAME_RULE",
    "STARTS_AT_FORMS",
    "TAG_MAX_LENGTH",
    "ResolvedMount",
    "ServicePort",
    "SessionConfig",
    "SessionRequest",
    "app_services",
    "declared_services",
    "parse_starts_at",
    "resolve_resources",
    "service_ports_from_environ",
    "session_name_problem",
]

SERVICE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
SERVICE_PORT_ENV_PREFIX = "BACKENDAI_SERVICE_PORT_"
TAG_MAX_LENGTH = 64
"""A session's ``tag`` (Backend.AI's free text annotation): one line, at most this long."""

_SESSION_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SESSION_NAME_RULE = (
    "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, not a UUID"
)


def session_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a session (None: it can).  The rule of ``POST /session``,
    ``rename`` and ``modify_compute_session``: :data:`SESSION_NAME_RULE`.

    >>> session_name_problem("train-1") is None
    True
    >>> session_name_problem("-x")
    "a session name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    """
    if not _SESSION_NAME_RE.fullmatch(name):
        return (
            "a session name is 1-64 letters, digits, '.', '_' or '-', starting with a"
            " letter or digit"
        )
    try:
        uuid.UUID(name)
    except ValueError:
        return None
    return "a session name must not look like a session id (a UUID)"


STARTS_AT_FORMS = (
    "an ISO 8601 time (2030-01-02T03:04:05Z; no zone: UTC) or a delay from now: seconds"
    " (30), or amounts with units d/day(s), h/hr(s)/hour(s), m/min(s)/minute(s),"
    " s/sec(s)/second(s), in that order (20s, 5m, 1h30m, 2d)"
)

# Backend.AI's relative forms (its manager's str_to_timedelta): each unit at most once,
# days to seconds, an optional sign; a bare number is seconds.
_DELAY_RE = re.compile(
    r"(?P<sign>[+-])?\s*"
    r"(?:(?P<days>\d+(?:\.\d+)?)(?:days|day|d))?\s*"
    r"(?:(?P<hours>\d+(?:\.\d+)?)(?:hours|hour|hrs|hr|h))?\s*"
    r"(?:(?P<minutes>\d+(?:\.\d+)?)(?:minutes|minute|mins|min|m))?\s*"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)(?:seconds|second|secs|sec|s))?"
)
_BARE_SECONDS_RE = re.compile(r"[+-]?\d+(?:\.\d+)?")
_MAX_DELAY = timedelta(days=3650)


def parse_starts_at(value: str | datetime) -> datetime | timedelta:
    """``startsAt`` as Backend.AI reads it: an ISO time (made aware: UTC when it has no
    zone) or a delay from now (:data:`STARTS_AT_FORMS`).  Raises ``ValueError``.

    >>> parse_starts_at("20s"), parse_starts_at("1h30m"), parse_starts_at("90")
    (datetime.timedelta(seconds=20), datetime.timedelta(seconds=5400), datetime.timedelta(seconds=90))
    >>> parse_starts_at("2030-01-02T03:04:05")
    datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    """
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    text = value.strip()
    if _BARE_SECONDS_RE.fullmatch(text):
        return _bounded(timedelta(seconds=float(text)), value)
    match = _DELAY_RE.fullmatch(text)
    if match and text and any(match.group(u) for u in ("days", "hours", "minutes", "seconds")):
        delay = timedelta(
            **{u: float(match.group(u) or 0) for u in ("days", "hours", "minutes", "seconds")}
        )
        return _bounded(-delay if match.group("sign") == "-" else delay, value)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ValueError(f"not a time or a delay: {value!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _bounded(delay: timedelta, value: str) -> timedelta:
    if abs(delay) > _MAX_DELAY:
        raise ValueError(f"a delay of at most {_MAX_DELAY.days} days (received {value!r})")
    return delay


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


#: Backend.AI's image label for the app services an image declares: ``jupyter:http:8888,...``
SERVICE_PORTS_LABEL = "ai.backend.service-ports"


def declared_services(labels: Mapping[str, Any] | None) -> tuple[ServicePort, ...]:
    """The HTTP app services an image declares in its ``ai.backend.service-ports`` label;
    entries that are not ``NAME:http:PORT`` (a valid service name, a port of 1024-65535)
    and repeated names or ports are left out.

    >>> declared_services({"ai.backend.service-ports": "jupyter:http:8888, x:tcp:22,bad"})
    (ServicePort(name='jupyter', protocol='http', port=8888),)
    """
    text = (labels or {}).get(SERVICE_PORTS_LABEL)
    found: list[ServicePort] = []
    for part in text.split(",") if isinstance(text, str) else ():
        name, _, rest = part.strip().partition(":")
        protocol, _, port = rest.partition(":")
        if (
            protocol == "http"
            and SERVICE_NAME_RE.fullmatch(name)
            and port.isascii()
            and port.isdigit()
            and 1024 <= int(port) <= 65535
            and all(s.name != name and s.port != int(port) for s in found)
        ):
            found.append(ServicePort(name=name, protocol=protocol, port=int(port)))
    return tuple(found)


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
    # None: the request names none, so the session gets its image's (declared_services)
    service_ports: tuple[ServicePort, ...] | None = None


@dataclass(frozen=True)
class ResolvedMount:
    """A storage folder the session mounts: its id (for the session's mount records)
    and the mount its kernels get (resolved by
    :meth:`~accelshare.manager.services.folders.FolderService.resolve_mounts`)."""

    folder_id: uuid.UUID
    mount: KernelMount


@dataclass(frozen=True)
class SessionRequest:
    """A session to enqueue, as :meth:`SessionService.create
    <accelshare.manager.services.sessions.SessionService.create>` takes it (the API's
    ``CreateSessionBody`` has checked the names, texts and ranges)."""

    image: str
    name: str | None = None
    type: Literal["interactive", "batch"] = "interactive"
    config: SessionConfig = field(default_factory=SessionConfig)
    priority: int = DEFAULT_PRIORITY
    # a time, or a delay from the moment the service enqueues the session
    starts_at: datetime | timedelta | None = None
    dependencies: tuple[str, ...] = ()
    enqueue_only: bool = False
    wait_for_agents: bool = False
    max_wait_seconds: int = 0
    startup_command: str | None = None
    group: str | None = None
    reuse_if_exists: bool = False
    owner_access_key: str | None = None
    tag: str | None = None
    mounts: tuple[ResolvedMount, ...] = ()


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
