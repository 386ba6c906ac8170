"""Turning a kernel's ``requested_slots`` (wire strings) into an allocation request (pure).

Rules (spec 01 "Known slot types", spec 04)::

    known slots {cpu: count, mem: bytes, cuda.shares: count}
    {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"}   -> {cpu: 1, mem: 1073741824, cuda.shares: 0.5}
    {"cpu": "1", "mem": "1g", "rocm.device": "0"}     -> rocm.device dropped (unknown, zero)
    {"cpu": "1", "mem": "1g", "rocm.device": "1"}     -> UnsupportedResource('rocm.device')
    {"mem": "1g"}                                     -> KernelRequestError (cpu missing)

Amounts are decimal strings.  A request without a plan (an older manager, a direct
RPC) may also write a ``bytes`` slot as a binary size (``"2g"``); a request that carries
the manager's plan has exact decimal strings only (the manager parsed the user's grammar
at its API), and :func:`parse_plan` reads the plan the same way.  They are read by the
strict parser of the pure core, exactly as written: ``"1_0"``, full-width digits or junk
fail the kernel with KernelRequestError; the allocation maps then refuse an amount off
their quantum grid (``NotMultipleOfQuantum``, nearest valid amounts named).  Known slots
requested as 0 are dropped as well (a map never allocates nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from accelshare.alloc import UnsupportedResource
from accelshare.common import (
    Allocation,
    CommonValueError,
    InvalidResourceSlotQuantity,
    SlotTypes,
    parse_amount,
)

__all__ = ["REQUIRED_SLOTS", "KernelRequestError", "parse_plan", "parse_requested_slots"]

REQUIRED_SLOTS = ("cpu", "mem")


class KernelRequestError(ValueError):
    """A create request the agent refuses before allocating (bad amount, cpu/mem missing).

    The message starts with the class name, like the allocation errors, because it is
    what the manager records as the kernel's failure reason.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(f"KernelRequestError: {detail}")
        self.detail = detail


def _amount(slot: str, text: str, slot_type: SlotTypes | None, *, exact: bool = False) -> Decimal:
    """One amount, read by the strict parser (:func:`accelshare.common.parse_amount`):
    exactly as written, or refused (``1_0``, full-width digits, junk).  A slot this
    agent does not know is read as a count, or else as a byte size; ``exact``: as a
    decimal string only (no ``"2g"``)."""
    if exact:
        kinds: tuple[SlotTypes, ...] = (SlotTypes.COUNT,)
    else:
        kinds = (slot_type,) if slot_type is not None else (SlotTypes.COUNT, SlotTypes.BYTES)
    value: Decimal | None = None
    refusal: CommonValueError | None = None
    for kind in kinds:
        try:
            value = parse_amount(slot, text, kind)
        except InvalidResourceSlotQuantity:
            raise KernelRequestError(
                f"the amount {text!r} of slot {slot!r} cannot be negative"
            ) from None
        except CommonValueError as e:
            refusal = refusal or e
            continue
        break
    if value is None or not value.is_finite():
        expected = f": expected {refusal.expected}" if refusal is not None else ""
        raise KernelRequestError(
            f"the amount {text!r} of slot {slot!r} is not a finite number{expected}"
        )
    return value


def parse_requested_slots(
    requested: Mapping[str, str],
    known_slots: Mapping[str, SlotTypes],
    *,
    kernel_id: str | None = None,
    exact: bool = False,
) -> dict[str, Decimal]:
    """The allocation request for ``requested`` (see the module docstring); ``exact``:
    decimal strings only (a request that carries a plan).

    Raises :class:`UnsupportedResource` for an unknown slot with a non-zero amount and
    :class:`KernelRequestError` for a malformed amount or a missing/zero ``cpu`` or ``mem``.
    """
    request: dict[str, Decimal] = {}
    for slot, text in requested.items():
        slot_type = known_slots.get(slot)
        amount = _amount(slot, text, slot_type, exact=exact)
        if slot_type is None:
            if amount != 0:
                raise UnsupportedResource(slot, amount, list(known_slots), context_tag=kernel_id)
            continue
        if amount != 0:
            request[slot] = amount
    missing = [slot for slot in REQUIRED_SLOTS if request.get(slot, Decimal(0)) <= 0]
    if missing:
        raise KernelRequestError(
            f"{' and '.join(missing)} must be requested with a positive amount "
            f"(requested: {dict(requested)})"
        )
    return request


def parse_plan(plan: Mapping[str, Mapping[str, str]]) -> Allocation:
    """The manager's placement (slot -> device -> exact decimal string) as Decimals,
    zeros left out; a malformed amount is a :class:`KernelRequestError`.

    >>> parse_plan({"cpu": {"0": "1", "1": "0"}, "cuda.shares": {"GPU1": "0.5"}})
    {'cpu': {'0': Decimal('1')}, 'cuda.shares': {'GPU1': Decimal('0.5')}}
    """
    parsed: Allocation = {}
    for slot, per_device in plan.items():
        for device, text in per_device.items():
            amount = _amount(f"{slot}@{device}", text, SlotTypes.COUNT, exact=True)
            if amount:
                parsed.setdefault(slot, {})[device] = amount
    return parsed
