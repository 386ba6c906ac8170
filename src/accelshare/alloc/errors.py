"""Errors of the allocation maps.

Hierarchy (every class is a ``ValueError``: each one reports a request or a
configuration the map cannot honour)::

    ValueError
     └── ResourceError                     base: structured fields, "<Class>: <detail>" message
          ├── InsufficientResource          not enough free capacity for a slot
          ├── PlanConflict                  a plan made elsewhere no longer fits: a device it
          │                                 names is gone or has less free than it puts there
          ├── FractionalResourceFragmented  enough in total, but only as fragments the caller refused
          ├── InvalidResourceArgument       a bad amount: type, NaN, infinite, negative, not whole,
          │    │                            unique slot not 1, freeing more than allocated, unknown device
          │    └── NotMultipleOfQuantum     a fractional amount off the quantum grid
          ├── InvalidResourceCombination    two mutually exclusive slots in one request
          ├── UnsupportedResource           a slot the map has no devices for
          └── AllocMapConfigError           a map built from inconsistent configuration

Every error carries the fields a caller needs to explain it without parsing the
message: ``slot``, ``requested``, ``available``, ``devices`` (per-device free amount
or other per-device state), ``context_tag`` (who asked, e.g. a kernel id), and the
message names them::

    InsufficientResource: cannot allocate 1.5 of cuda.shares: 1.2 free (GPU1 0.4, GPU2 0.8)

Errors survive pickling with their fields (an agent may ship them across processes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

__all__ = [
    "AllocMapConfigError",
    "FractionalResourceFragmented",
    "InsufficientResource",
    "InvalidResourceArgument",
    "InvalidResourceCombination",
    "NotMultipleOfQuantum",
    "PlanConflict",
    "ResourceError",
    "UnsupportedResource",
    "format_amount",
]


def format_amount(value: Any) -> str:
    """A readable amount: Decimals without trailing zeros (``0.40`` -> ``0.4``), else ``repr``."""
    if isinstance(value, Decimal) and not value.is_nan():
        return format(value.normalize(), "f")  # fixed-point, no trailing zeros, never 1E+1
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return repr(value)


def _format_devices(devices: Mapping[str, Decimal]) -> str:
    return ", ".join(f"{device} {format_amount(amount)}" for device, amount in devices.items())


def _rebuild(cls: type[ResourceError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ResourceError(ValueError):
    """Base of every allocation-map error; ``str(e)`` is ``"<ClassName>: <detail>"``.

    The "does not fit" errors build their detail from their fields only when it is
    read: a scheduler's dry runs raise and catch thousands of them and read few.
    ``args`` holds the constructor's positional arguments.
    """

    slot: str | None
    requested: Any
    available: Decimal | None
    devices: dict[str, Decimal]
    context_tag: str | None

    def __init__(
        self,
        detail: str | None = None,
        *,
        slot: str | None = None,
        requested: Any = None,
        available: Decimal | None = None,
        devices: Mapping[str, Decimal] | None = None,
        context_tag: str | None = None,
    ) -> None:
        # No super().__init__(message): BaseException.__new__ already kept the
        # positional arguments in ``args``, and the message is made by __str__.
        self._detail = detail
        self.slot = slot
        self.requested = requested
        self.available = available
        self.devices = dict(devices or {})
        self.context_tag = context_tag

    @property
    def detail(self) -> str:
        """The message without the class name and context tag."""
        if self._detail is None:
            self._detail = self._describe()
        return self._detail

    def _describe(self) -> str:
        return ""

    def __str__(self) -> str:
        tag = f" [context: {self.context_tag}]" if self.context_tag else ""
        return f"{type(self).__name__}: {self.detail}{tag}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.detail!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclass constructors take different arguments; rebuild from the state instead.
        return (_rebuild, (type(self), self.args, {**self.__dict__, "_detail": self.detail}))


class InsufficientResource(ResourceError):
    """Not enough free capacity: ``devices`` holds each device's free amount."""

    def __init__(
        self,
        slot: str,
        requested: Decimal,
        available: Decimal,
        devices: Mapping[str, Decimal],
        *,
        context_tag: str | None = None,
        note: str = "",
    ) -> None:
        super().__init__(
            slot=slot,
            requested=requested,
            available=available,
            devices=devices,
            context_tag=context_tag,
        )
        self.note = note

    def _describe(self) -> str:
        return (
            f"cannot allocate {format_amount(self.requested)} of {self.slot}: "
            f"{format_amount(self.available)} free ({_format_devices(self.devices)}){self.note}"
        )


class PlanConflict(ResourceError):
    """A plan (slot -> device -> amount, made by the manager) that no longer fits this map:
    a device it names is not there, or has less free than the plan puts on it.  The map's
    state differs from the one the plan was made for; ``devices`` holds each such
    device's free amount (0 for a device that is not there)."""

    def __init__(
        self,
        slot: str,
        requested: Decimal,
        devices: Mapping[str, Decimal],
        *,
        why: str,
        context_tag: str | None = None,
    ) -> None:
        super().__init__(
            slot=slot,
            requested=requested,
            available=sum(devices.values(), Decimal(0)),
            devices=devices,
            context_tag=context_tag,
        )
        self.why = why

    def _describe(self) -> str:
        device = next(iter(self.devices), "?")
        return (
            f"the plan puts {format_amount(self.requested)} of {self.slot} on {device},"
            f" which no longer fits: {self.why}"
        )


class FractionalResourceFragmented(ResourceError):
    """Enough capacity in total, but only as fragments (``allow_fragmentation=False``)."""

    def __init__(
        self,
        slot: str,
        requested: Decimal,
        available: Decimal,
        devices: Mapping[str, Decimal],
        *,
        context_tag: str | None = None,
    ) -> None:
        super().__init__(
            slot=slot,
            requested=requested,
            available=available,
            devices=devices,
            context_tag=context_tag,
        )

    def _describe(self) -> str:
        return (
            f"cannot allocate {format_amount(self.requested)} of {self.slot} without"
            f" fragmenting it: {format_amount(self.available)} free but only in fragments"
            f" ({_format_devices(self.devices)}); no single device holds it and no even"
            " split over whole devices fits"
        )


class InvalidResourceArgument(ResourceError):
    """A bad amount or device: ``expected`` says what would have been accepted."""

    def __init__(
        self,
        detail: str,
        *,
        slot: str | None,
        requested: Any,
        expected: str,
        device: str | None = None,
        context_tag: str | None = None,
    ) -> None:
        super().__init__(detail, slot=slot, requested=requested, context_tag=context_tag)
        self.expected = expected
        self.device = device


class NotMultipleOfQuantum(InvalidResourceArgument):
    """A fractional amount off the quantum grid; ``lower``/``upper`` are the nearest valid ones."""

    def __init__(
        self,
        slot: str,
        requested: Decimal,
        quantum: Decimal,
        *,
        lower: Decimal,
        upper: Decimal,
        context_tag: str | None = None,
    ) -> None:
        q, lo, hi = (format_amount(v) for v in (quantum, lower, upper))
        super().__init__(
            f"cannot allocate {format_amount(requested)} of {slot}: not a multiple of the"
            f" quantum {q} (nearest valid amounts: {lo} and {hi})",
            slot=slot,
            requested=requested,
            expected=f"a multiple of {q}",
            context_tag=context_tag,
        )
        self.quantum = quantum
        self.lower = lower
        self.upper = upper


class InvalidResourceCombination(ResourceError):
    """Two different slots of one exclusive set requested together (``slots``)."""

    def __init__(
        self,
        slots: Sequence[str],
        exclusive_slot_types: Sequence[str],
        *,
        context_tag: str | None = None,
    ) -> None:
        first, second = slots[0], slots[1]
        super().__init__(
            f"{first} and {second} cannot be allocated together (mutually exclusive slots:"
            f" {', '.join(exclusive_slot_types)})",
            slot=first,
            context_tag=context_tag,
        )
        self.slots = tuple(slots)
        self.exclusive_slot_types = tuple(exclusive_slot_types)


class UnsupportedResource(ResourceError):
    """A non-zero request for a slot the map (agent) has no devices for."""

    def __init__(
        self,
        slot: str,
        requested: Any = None,
        known_slots: Sequence[str] = (),
        *,
        context_tag: str | None = None,
    ) -> None:
        known = ", ".join(known_slots) if known_slots else "none"
        amount = "" if requested is None else f" (requested {format_amount(requested)})"
        super().__init__(
            f"no devices for slot {slot!r}{amount}; slots available here: {known}",
            slot=slot,
            requested=requested,
            context_tag=context_tag,
        )
        self.known_slots = tuple(known_slots)


class AllocMapConfigError(ResourceError):
    """A map cannot be built: bad capacity, quantum, strategy, NUMA node or slot type."""

    def __init__(self, detail: str, *, field: str, received: Any) -> None:
        super().__init__(detail, requested=received)
        self.field = field
        self.received = received


_E = TypeVar("_E", bound=enum.Enum)


def parse_enum_member(cls: type[_E], value: _E | str, *, field: str, what: str) -> _E:
    """A member of ``cls`` from itself or its name in any case (``"evenly"`` -> EVENLY).

    Raises :class:`AllocMapConfigError` naming ``field``, the names expected and the value.
    """
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and value.strip().upper() in cls.__members__:
        return cls[value.strip().upper()]
    names = " or ".join(cls.__members__)
    raise AllocMapConfigError(
        f"unknown {what} {value!r}: expected {names}", field=field, received=value
    )
