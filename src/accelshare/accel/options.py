"""Accelerator options from the config store, device shares and their inverse.

The options live at ``config/plugins/accelerator/<key>/<option>`` (the mock plugin
falls back to ``config/plugins/accelerator/mock/<option>`` key by key), merged over
scopes node -> scaling group -> global by the store.  :func:`read_accelerator_options`
is the only I/O here; everything else is pure.

Shares of one device, exact::

    shares = min(memory / unit_mem, processors / unit_proc), truncated to 0.01
    40 GiB, 108 SMs, defaults (2 GiB, 8):   min(20, 13.5)  = 13.50
    40 GiB, 108 SMs, 1 GiB, 10:              min(40, 10.8)  = 10.80
    2 GiB, 108 SMs, defaults:                min(1, 13.5)   = 1.00

and its inverse for a kernel holding ``s`` shares: memory ``floor(unit_mem * s)`` bytes,
processors ``max(floor(unit_proc * s), 4)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

from accelshare.common import BinarySize, CommonValueError
from accelshare.config.store import ConfigStore

from .errors import PluginConfigError
from .types import AllocationMode

__all__ = [
    "DEFAULT_RESERVED_MEMORY",
    "DEFAULT_UNIT_MEM",
    "DEFAULT_UNIT_PROC",
    "MIN_PROCESSOR_LIMIT",
    "MIN_UNIT_MEM",
    "MIN_UNIT_PROC",
    "PLUGIN_CONFIG_PREFIX",
    "AcceleratorOptions",
    "RawOptions",
    "device_shares",
    "parse_accelerator_options",
    "read_accelerator_options",
    "share_limits",
]

PLUGIN_CONFIG_PREFIX = "config/plugins/accelerator"
MIN_UNIT_MEM = 512 * 2**20  # 512 MiB
MIN_UNIT_PROC = 2
MIN_PROCESSOR_LIMIT = 4  # TensorFlow's TF_MIN_GPU_MULTIPROCESSOR_COUNT
DEFAULT_UNIT_MEM = 2 * 2**30  # 2 GiB
DEFAULT_UNIT_PROC = 8
DEFAULT_RESERVED_MEMORY = 64 * 2**20  # 64 MiB
_HUNDREDTH = Decimal("0.01")


def device_shares(memory_bytes: int, processors: int, unit_mem: int, unit_proc: int) -> Decimal:
    """``min(memory/unit_mem, processors/unit_proc)`` truncated to 2 decimals, exactly.

    Integer arithmetic: the floor of a minimum is the minimum of the floors.
    """
    hundredths = min(memory_bytes * 100 // unit_mem, processors * 100 // unit_proc)
    return (Decimal(hundredths) * _HUNDREDTH).quantize(_HUNDREDTH)


def share_limits(shares: Decimal, unit_mem: int, unit_proc: int) -> tuple[int, int]:
    """(memory bytes, processors) a kernel holding ``shares`` of a device may use."""
    memory = int((Decimal(unit_mem) * shares).to_integral_value(rounding=ROUND_FLOOR))
    processors = int((Decimal(unit_proc) * shares).to_integral_value(rounding=ROUND_FLOOR))
    return memory, max(processors, MIN_PROCESSOR_LIMIT)


@dataclass(frozen=True, slots=True)
class AcceleratorOptions:
    allocation_mode: AllocationMode = AllocationMode.DISCRETE
    unit_mem: int = DEFAULT_UNIT_MEM
    unit_proc: int = DEFAULT_UNIT_PROC
    quantum_size: Decimal = Decimal("0.1")
    device_mask: tuple[str, ...] = ()
    reserved_memory: int = DEFAULT_RESERVED_MEMORY
    # option -> where its value came from (for error messages found after parsing)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source(self, option: str) -> str:
        return self.sources.get(option, "config store")

    def shares(self, memory_bytes: int, processors: int) -> Decimal:
        return device_shares(memory_bytes, processors, self.unit_mem, self.unit_proc)

    def limits(self, shares: Decimal) -> tuple[int, int]:
        return share_limits(shares, self.unit_mem, self.unit_proc)

    def describe(self) -> dict[str, str]:
        """The effective options as strings (for ``accelshare agent plugins``)."""
        return {
            "allocation_mode": self.allocation_mode.value,
            "unit_mem": str(self.unit_mem),
            "unit_proc": str(self.unit_proc),
            "quantum_size": str(self.quantum_size),
            "device_mask": ",".join(self.device_mask),
            "reserved_memory": str(self.reserved_memory),
        }


@dataclass(frozen=True, slots=True)
class RawOptions:
    """Option values as read (strings from the store) and where each one came from."""

    values: Mapping[str, object] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)


def _text(value: object, source: str, key: str, expected: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise PluginConfigError(source, key, expected, value)
    return str(value).strip()


def _size(value: object, source: str, key: str, expected: str, minimum: int) -> int:
    text = _text(value, source, key, expected)
    try:
        size = int(BinarySize.finite_from_str(text))
    except CommonValueError:
        raise PluginConfigError(source, key, expected, value) from None
    if size < minimum:
        raise PluginConfigError(source, key, expected, value)
    return size


def parse_accelerator_options(
    raw: RawOptions | Mapping[str, object],
    *,
    source: str = "config store",
    default_quantum: Decimal = Decimal("0.1"),
) -> AcceleratorOptions:
    """Validate option values (pure).  Unknown keys are ignored.

    Errors name the store key the value came from, the option, what was expected and
    what was received.
    """
    if not isinstance(raw, RawOptions):
        raw = RawOptions(values=dict(raw))
    values, sources = raw.values, raw.sources

    def src(key: str) -> str:
        return sources.get(key, source)

    mode = AllocationMode.DISCRETE
    if "allocation_mode" in values:
        expected = "'discrete' or 'fractional'"
        text = _text(values["allocation_mode"], src("allocation_mode"), "allocation_mode", expected)
        try:
            mode = AllocationMode(text.lower())
        except ValueError:
            raise PluginConfigError(
                src("allocation_mode"), "allocation_mode", expected, values["allocation_mode"]
            ) from None

    unit_mem = DEFAULT_UNIT_MEM
    if "unit_mem" in values:
        unit_mem = _size(
            values["unit_mem"],
            src("unit_mem"),
            "unit_mem",
            "a byte size >= 512 MiB such as '1g' or 1073741824",
            MIN_UNIT_MEM,
        )

    unit_proc = DEFAULT_UNIT_PROC
    if "unit_proc" in values:
        expected = "a whole number of processors >= 2"
        text = _text(values["unit_proc"], src("unit_proc"), "unit_proc", expected)
        if not text.isdigit() or int(text) < MIN_UNIT_PROC:
            raise PluginConfigError(src("unit_proc"), "unit_proc", expected, values["unit_proc"])
        unit_proc = int(text)

    quantum = default_quantum
    if "quantum_size" in values:
        expected = "a decimal number > 0 and <= 1 such as '0.1'"
        text = _text(values["quantum_size"], src("quantum_size"), "quantum_size", expected)
        try:
            quantum = Decimal(text)
        except InvalidOperation:
            quantum = Decimal("NaN")
        if not quantum.is_finite() or not Decimal(0) < quantum <= 1:
            raise PluginConfigError(
                src("quantum_size"), "quantum_size", expected, values["quantum_size"]
            )

    mask: tuple[str, ...] = ()
    if "device_mask" in values:
        text = _text(
            values["device_mask"], src("device_mask"), "device_mask", "comma-separated device ids"
        )
        mask = tuple(part.strip() for part in text.split(",") if part.strip())

    reserved = DEFAULT_RESERVED_MEMORY
    if "reserved_memory" in values:
        reserved = _size(
            values["reserved_memory"],
            src("reserved_memory"),
            "reserved_memory",
            "a byte size >= 0 such as '64m'",
            0,
        )

    return AcceleratorOptions(
        allocation_mode=mode,
        unit_mem=unit_mem,
        unit_proc=unit_proc,
        quantum_size=quantum,
        device_mask=mask,
        reserved_memory=reserved,
        sources={key: src(key) for key in values},
    )


async def read_accelerator_options(
    store: ConfigStore, key: str, *, fallback_keys: tuple[str, ...] = ()
) -> RawOptions:
    """Read ``config/plugins/accelerator/<key>/`` (merged over scopes).

    Options missing there are taken from ``config/plugins/accelerator/<fallback>/`` for
    each fallback key in order (the mock plugin passes ``("mock",)``).
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for prefix_key in (key, *(k for k in fallback_keys if k != key)):
        prefix = f"{PLUGIN_CONFIG_PREFIX}/{prefix_key}"
        tree = await store.get_prefix(prefix)
        for name, value in tree.items():
            if name in values or name == "":
                continue
            values[name] = value
            sources[name] = f"config store {prefix}/"
    return RawOptions(values=values, sources=sources)
