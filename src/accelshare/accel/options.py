"""Accelerator options from the config store, device shares and their inverse.

The options live at ``config/plugins/accelerator/<key>/<option>`` (the mock plugin
falls back to ``config/plugins/accelerator/mock/<option>``), in the scopes node,
scaling group and global.  Precedence, option by option (:func:`option_layer_order`,
:func:`merge_option_layers`)::

    node/<key>  >  node/mock  >  sgroup/<key>  >  sgroup/mock  >  global/<key>  >  global/mock

the first scope (node -> scaling group -> global) that sets the option under either
prefix wins; within one scope the plugin's own key beats ``mock``.  So a node-level
``mock/unit_mem`` overrides a cluster-wide ``cuda/unit_mem``: the more specific scope
decides, whichever spelling of the prefix it uses.  An option name that is not one of
:data:`OPTION_NAMES` (under any prefix, in any scope) is refused with
:class:`~accelshare.accel.errors.UnknownOptionError`, so a typo never silently leaves
the default in place.  :func:`read_accelerator_options` is the only I/O here;
everything else is pure.

Shares of one device, exact::

    shares = min(memory / unit_mem, processors / unit_proc), truncated to 0.01
    40 GiB, 108 SMs, defaults (2 GiB, 8):   min(20, 13.5)  = 13.50
    40 GiB, 108 SMs, 1 GiB, 10:              min(40, 10.8)  = 10.80
    2 GiB, 108 SMs, defaults:                min(1, 13.5)   = 1.00

and its inverse for a kernel holding ``s`` shares: memory ``floor(unit_mem * s)`` bytes,
processors ``max(floor(unit_proc * s), 4)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

from accelshare.common import AllocationMode, BinarySize, CommonValueError
from accelshare.config.store import ConfigStore
from accelshare.config.types import ConfigScopes

from .errors import PluginConfigError, UnknownOptionError

__all__ = [
    "DEFAULT_RESERVED_MEMORY",
    "DEFAULT_UNIT_MEM",
    "DEFAULT_UNIT_PROC",
    "MIN_PROCESSOR_LIMIT",
    "MIN_UNIT_MEM",
    "MIN_UNIT_PROC",
    "OPTION_NAMES",
    "PLUGIN_CONFIG_PREFIX",
    "SCOPE_PRECEDENCE",
    "AcceleratorOptions",
    "OptionLayer",
    "RawOptions",
    "allocatable_shares",
    "device_shares",
    "merge_option_layers",
    "option_layer_order",
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
OPTION_NAMES = (
    "allocation_mode",
    "unit_mem",
    "unit_proc",
    "quantum_size",
    "device_mask",
    "reserved_memory",
)
SCOPE_PRECEDENCE = (ConfigScopes.NODE, ConfigScopes.SCALING_GROUP, ConfigScopes.GLOBAL)


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
    """Validate option values (pure).

    Errors name the store key the value came from, the option, what was expected and
    what was received; an option name outside :data:`OPTION_NAMES` is an
    :class:`UnknownOptionError` naming the known ones.
    """
    if not isinstance(raw, RawOptions):
        raw = RawOptions(values=dict(raw))
    values, sources = raw.values, raw.sources

    def src(key: str) -> str:
        return sources.get(key, source)

    for name in sorted(values):
        if name not in OPTION_NAMES:
            shown = name or "(a value stored at the prefix itself)"
            raise UnknownOptionError(src(name), shown, OPTION_NAMES, values[name])

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


def allocatable_shares(
    options: AcceleratorOptions, device_id: str, memory_bytes: int, processors: int
) -> Decimal:
    """A device's shares, refusing a device that could never be allocated (pure).

    A device below one quantum (0.00 shares, or 0.05 with a quantum of 0.1) would sit in
    the fractional map unusable; that is a configuration mistake (units too large for
    the device), reported on the option that limits it::

        2 GiB, 108 SMs, unit_mem 4 GiB  ->  0.50 shares, fine
        1 GiB, 108 SMs, unit_mem 200 GiB  ->  PluginConfigError on 'unit_mem'
    """
    shares = options.shares(memory_bytes, processors)
    if shares >= options.quantum_size:
        return shares
    by_memory = memory_bytes * options.unit_proc <= processors * options.unit_mem
    key, value = ("unit_mem", options.unit_mem) if by_memory else ("unit_proc", options.unit_proc)
    raise PluginConfigError(
        options.source(key),
        key,
        f"a value small enough that device {device_id!r} ({memory_bytes} bytes of memory, "
        f"{processors} processors) gets at least one quantum ({options.quantum_size}) of "
        f"shares, instead of {shares}; or exclude the device with device_mask",
        value,
    )


@dataclass(frozen=True, slots=True)
class OptionLayer:
    """The option values found under one prefix in one scope of the store."""

    scope: ConfigScopes
    prefix_key: str  # "cuda", "mock"
    source: str  # "config store config/plugins/accelerator/cuda/ (global scope)"
    values: Mapping[str, object]


def option_layer_order(
    scopes: Iterable[ConfigScopes], key: str, fallback_keys: Sequence[str] = ()
) -> list[tuple[ConfigScopes, str]]:
    """(scope, prefix key) pairs to read, highest precedence first (pure).

    ``option_layer_order([GLOBAL, SCALING_GROUP, NODE], "cuda", ("mock",))`` ->
    ``[(NODE, "cuda"), (NODE, "mock"), (SCALING_GROUP, "cuda"), (SCALING_GROUP, "mock"),
    (GLOBAL, "cuda"), (GLOBAL, "mock")]``; scopes the store does not have are left out.
    """
    present = set(scopes)
    keys = [key, *(k for k in dict.fromkeys(fallback_keys) if k != key)]
    return [(scope, k) for scope in SCOPE_PRECEDENCE if scope in present for k in keys]


def merge_option_layers(layers: Sequence[OptionLayer]) -> RawOptions:
    """Each option from the first layer that has it (layers highest precedence first)."""
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.values.items():
            if name not in values:
                values[name] = value
                sources[name] = layer.source
    return RawOptions(values=values, sources=sources)


def _layer_source(scope_prefix: str, prefix: str, scope: ConfigScopes) -> str:
    path = f"{scope_prefix}/{prefix}" if scope_prefix else prefix
    return f"config store {path}/ ({scope.value} scope)"


async def read_accelerator_options(
    store: ConfigStore, key: str, *, fallback_keys: Sequence[str] = ()
) -> RawOptions:
    """Read ``config/plugins/accelerator/<key>/`` (and the fallbacks) in every scope.

    Merged option by option with :func:`merge_option_layers` in the order of
    :func:`option_layer_order` (see the module docstring); the mock plugin passes
    ``fallback_keys=("mock",)``.  Each value's source names the scope and prefix it
    came from, for error messages.
    """
    scope_prefixes = store.scope_prefix_map
    layers: list[OptionLayer] = []
    for scope, prefix_key in option_layer_order(scope_prefixes, key, fallback_keys):
        prefix = f"{PLUGIN_CONFIG_PREFIX}/{prefix_key}"
        tree = await store.get_prefix(prefix, scope=scope)
        source = _layer_source(scope_prefixes[scope], prefix, scope)
        layers.append(OptionLayer(scope, prefix_key, source, dict(tree)))
    return merge_option_layers(layers)
