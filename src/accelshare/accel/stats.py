"""Synthetic device statistics for mocked devices, driven by what is allocated on them.

**Load.**  Each tick takes, per device, a :class:`DeviceLoad`: ``a``, the allocated
fraction of the device (shares held / the device's shares in fractional mode; 1 when a
kernel holds the whole device or MIG slice, 0 when it is free), and ``H``, the memory
those holdings may use (``unit_mem × shares`` each, or the whole device).  Readings are
drawn around that load, inside the spec's ranges (utilisation 0..100 %, memory 0..size,
power 0..:data:`POWER_MAX_W` W, temperature 0..:data:`TEMPERATURE_MAX_C` °C)::

    utilisation   a × U(70, 100) %                    never above a × 100 (free: 0 %)
    memory used   B + H × U(0.2, 1.0)                 never above B + H
    power         N(50 + 150a, 3 + 12a) W             idle ~50 W, fully allocated ~200 W
    temperature   N(35 + 50a, 1 + 4a) °C              idle ~35 °C, fully allocated ~85 °C

``B`` is a fixed baseline (the driver's own use: 1 % of the device, at most 256 MiB).
The spec's draw for memory, ``U(0.2, 1.0)``, thus applies to the memory held rather
than to the whole device.  Allocation is the only signal: mock devices run nothing, so
there is no per-kernel activity to follow, and a session that holds a GPU counts as
using it.

**Smoothing** (``stats_smoothing``) keeps readings moving gradually, as real hardware does:

- ``none``: every tick is a fresh draw (Backend.AI's behaviour)
- ``ema``: ``value += factor × (draw − value)`` (exponential moving average)
- ``random-walk``: ``value += factor × (mean − value) + N(0, factor × spread / 4)``, a walk
  pulled toward the load's mean (``spread``: the width of the load's draws)

With ``ema`` and ``random-walk`` a reading moves at most ``factor`` × its range per tick,
except that utilisation and memory drop at once to their ceiling (``a × 100``, ``B + H``)
when an allocation is released: a finished session's work and memory are gone, while
power and temperature cool down gradually.  Converged, every reading's expectation
rises with the load.

All randomness comes from one ``random.Random`` (``seed``, or an injected ``rng``), and
each device takes the same number of draws every tick whatever its load, so a seed makes
a run reproducible (tests) and two runs with different loads see the same noise.  No
clock is involved: one call is one tick.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

__all__ = [
    "IDLE_LOAD",
    "MEM_BASELINE_MAX",
    "POWER_MAX_W",
    "TEMPERATURE_MAX_C",
    "DeviceLoad",
    "DeviceSample",
    "MockStatsGenerator",
    "memory_baseline",
]

POWER_MAX_W = 250
TEMPERATURE_MAX_C = 120
MEM_BASELINE_MAX = 256 << 20  # bytes
_RANGES = {
    "util": (0.0, 100.0),
    "mem": (0.0, 1.0),  # fraction of the device's memory
    "power": (0.0, float(POWER_MAX_W)),
    "temperature": (0.0, float(TEMPERATURE_MAX_C)),
}
# (idle, fully allocated) pairs of the model in the module docstring.
_UTIL_BUSY = (70.0, 100.0)  # a × U(low, high)
_MEM_HELD = (0.2, 1.0)  # fraction of the memory held in use: U(low, high)
_POWER_MEAN, _POWER_SD = (50.0, 200.0), (3.0, 15.0)
_TEMPERATURE_MEAN, _TEMPERATURE_SD = (35.0, 85.0), (1.0, 5.0)


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What is allocated on one device: ``fraction`` of it (0..1), ``held_bytes`` of memory."""

    fraction: Decimal
    held_bytes: int

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"allocated fraction {self.fraction} is not within 0..1")
        if self.held_bytes < 0:
            raise ValueError(f"held memory {self.held_bytes} is negative")


IDLE_LOAD = DeviceLoad(Decimal(0), 0)


def memory_baseline(memory_bytes: int) -> int:
    """Memory a free device shows in use: 1 % of it, at most :data:`MEM_BASELINE_MAX`."""
    return min(memory_bytes // 100, MEM_BASELINE_MAX)


@dataclass(frozen=True, slots=True)
class DeviceSample:
    mem_used: int  # bytes
    mem_total: int
    util: Decimal | None  # percent, 0..100 (None: the device cannot tell)
    power: Decimal | None  # watts, 0..power_max
    temperature: Decimal | None  # celsius, 0..temperature_max
    power_max: Decimal = Decimal(POWER_MAX_W)
    temperature_max: Decimal = Decimal(TEMPERATURE_MAX_C)
    # The fraction of the device that kernels hold, 0..1, when the readings follow it
    # (mock devices); None where the readings are measured (real GPUs).
    allocated: Decimal | None = None

    @property
    def mem_fraction(self) -> Decimal:
        return Decimal(self.mem_used) / Decimal(self.mem_total) if self.mem_total else Decimal(0)

    def part(self, share: Decimal) -> Decimal:
        """The part of this device's load that a holder of ``share`` (a fraction of the
        device, 0..1) accounts for: its part of what is allocated (``share / allocated``,
        at most 1) where the readings follow allocations, else ``share`` itself."""
        if self.allocated is None or self.allocated <= 0:
            return min(Decimal(1), share)
        return min(Decimal(1), share / self.allocated)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _between(pair: tuple[float, float], a: float) -> float:
    idle, busy = pair
    return idle + (busy - idle) * a


def _one_decimal(value: float) -> Decimal:
    return Decimal(f"{value + 0.0:.1f}")  # + 0.0: no "-0.0"


@dataclass(frozen=True, slots=True)
class _Model:
    """One device's load in the generator's own terms (floats, memory as a fraction)."""

    a: float
    baseline: float  # fraction of the device
    held: float  # fraction of the device
    mem_ceiling: int  # bytes: baseline + held, exact

    @classmethod
    def of(cls, load: DeviceLoad, memory_bytes: int) -> _Model:
        base = memory_baseline(memory_bytes)
        held = min(load.held_bytes, memory_bytes - base)
        total = float(memory_bytes) if memory_bytes else 1.0
        return cls(float(load.fraction), base / total, held / total, base + held)

    def ceiling(self, name: str) -> float:
        if name == "util":
            return 100.0 * self.a
        if name == "mem":
            return self.baseline + self.held
        return _RANGES[name][1]

    def mean(self, name: str) -> float:
        if name == "util":
            return self.a * sum(_UTIL_BUSY) / 2
        if name == "mem":
            return self.baseline + self.held * sum(_MEM_HELD) / 2
        if name == "power":
            return _between(_POWER_MEAN, self.a)
        return _between(_TEMPERATURE_MEAN, self.a)

    def spread(self, name: str) -> float:
        """The width of the draws (4 standard deviations for the normal ones)."""
        if name == "util":
            return self.a * (_UTIL_BUSY[1] - _UTIL_BUSY[0])
        if name == "mem":
            return self.held * (_MEM_HELD[1] - _MEM_HELD[0])
        if name == "power":
            return 4 * _between(_POWER_SD, self.a)
        return 4 * _between(_TEMPERATURE_SD, self.a)


class MockStatsGenerator:
    """Per-device synthetic readings; see the module docstring."""

    def __init__(
        self,
        devices: Sequence[tuple[str, int]],  # (device id, memory bytes), in report order
        *,
        smoothing: str = "none",
        factor: Decimal = Decimal("0.3"),
        seed: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if smoothing not in ("none", "ema", "random-walk"):
            raise ValueError(f"unknown stats smoothing {smoothing!r}")
        self._devices = tuple(devices)
        self._smoothing = smoothing
        self._factor = float(factor)
        self._rng = rng if rng is not None else random.Random(seed)
        self._state: dict[str, dict[str, float]] = {}
        self._last: dict[str, DeviceSample] | None = None

    def _draw(self, model: _Model) -> dict[str, float]:
        rng = self._rng
        a = model.a
        return {
            "util": a * rng.uniform(*_UTIL_BUSY),
            "mem": model.baseline + model.held * rng.uniform(*_MEM_HELD),
            "power": rng.normalvariate(_between(_POWER_MEAN, a), _between(_POWER_SD, a)),
            "temperature": rng.normalvariate(
                _between(_TEMPERATURE_MEAN, a), _between(_TEMPERATURE_SD, a)
            ),
        }

    def _advance(self, previous: dict[str, float] | None, model: _Model) -> dict[str, float]:
        if previous is None or self._smoothing == "none":
            moved = self._draw(model)
        else:
            if self._smoothing == "ema":
                draw = self._draw(model)
                steps = {name: self._factor * (draw[name] - previous[name]) for name in _RANGES}
            else:
                steps = {
                    name: self._factor * (model.mean(name) - previous[name])
                    + self._rng.normalvariate(0.0, self._factor * model.spread(name) / 4)
                    for name in _RANGES
                }
            moved = {}
            for name, (low, high) in _RANGES.items():
                limit = self._factor * (high - low)
                moved[name] = previous[name] + _clamp(steps[name], -limit, limit)
        bounded = {}
        for name, (low, high) in _RANGES.items():
            bounded[name] = _clamp(moved[name], low, min(high, model.ceiling(name)))
        return bounded

    def tick(self, loads: Mapping[str, DeviceLoad] | None = None) -> dict[str, DeviceSample]:
        """Advance one collection tick and return every device's reading.

        ``loads``: what is allocated on each device (a device left out is free)."""
        loads = loads or {}
        samples: dict[str, DeviceSample] = {}
        for device_id, memory_bytes in self._devices:
            load = loads.get(device_id, IDLE_LOAD)
            model = _Model.of(load, memory_bytes)
            state = self._advance(self._state.get(device_id), model)
            self._state[device_id] = state
            samples[device_id] = DeviceSample(
                mem_used=min(int(memory_bytes * state["mem"]), model.mem_ceiling),
                mem_total=memory_bytes,
                util=_one_decimal(state["util"]),
                power=_one_decimal(state["power"]),
                temperature=_one_decimal(state["temperature"]),
                allocated=load.fraction,
            )
        self._last = samples
        return samples

    def current(self, loads: Mapping[str, DeviceLoad] | None = None) -> dict[str, DeviceSample]:
        """The latest tick's readings (one tick with ``loads`` is taken if none happened yet)."""
        return self._last if self._last is not None else self.tick(loads)
