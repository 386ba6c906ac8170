"""Synthetic device statistics for mocked devices, optionally smoothed and seeded.

Each tick draws, per device (spec 03): memory used = size × U(0.2, 1.0), utilisation
U(0, 100) %, power N(200 W, 50 W) clamped to [0, 250], temperature N(90 °C, 20 °C)
clamped to [0, 120].  Backend.AI shows these raw draws, which jump around; the
``smoothing`` option makes them move like real hardware:

- ``none``: every tick is a fresh draw (Backend.AI's behaviour)
- ``ema``: ``value += factor × (draw − value)`` (exponential moving average)
- ``random-walk``: ``value += N(0, factor × range / 4)``, kept inside the range

All randomness comes from one ``random.Random(seed)``, so a seed makes a run
reproducible (tests).  No clock is involved: one call is one tick.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["POWER_MAX_W", "TEMPERATURE_MAX_C", "DeviceSample", "MockStatsGenerator"]

POWER_MAX_W = 250
TEMPERATURE_MAX_C = 120
_RANGES = {
    "mem_fraction": (0.2, 1.0),
    "util": (0.0, 100.0),
    "power": (0.0, float(POWER_MAX_W)),
    "temperature": (0.0, float(TEMPERATURE_MAX_C)),
}


@dataclass(frozen=True, slots=True)
class DeviceSample:
    mem_used: int  # bytes
    mem_total: int
    util: Decimal | None  # percent, 0..100 (None: the device cannot tell)
    power: Decimal | None  # watts, 0..power_max
    temperature: Decimal | None  # celsius, 0..temperature_max
    power_max: Decimal = Decimal(POWER_MAX_W)
    temperature_max: Decimal = Decimal(TEMPERATURE_MAX_C)

    @property
    def mem_fraction(self) -> Decimal:
        return Decimal(self.mem_used) / Decimal(self.mem_total) if self.mem_total else Decimal(0)


def _clamp(value: float, name: str) -> float:
    low, high = _RANGES[name]
    return min(max(value, low), high)


def _one_decimal(value: float) -> Decimal:
    return Decimal(f"{value:.1f}")


class MockStatsGenerator:
    """Per-device synthetic readings; see the module docstring."""

    def __init__(
        self,
        devices: Sequence[tuple[str, int]],  # (device id, memory bytes), in report order
        *,
        smoothing: str = "none",
        factor: Decimal = Decimal("0.3"),
        seed: int | None = None,
    ) -> None:
        if smoothing not in ("none", "ema", "random-walk"):
            raise ValueError(f"unknown stats smoothing {smoothing!r}")
        self._devices = tuple(devices)
        self._smoothing = smoothing
        self._factor = float(factor)
        self._rng = random.Random(seed)
        self._state: dict[str, dict[str, float]] = {}
        self._last: dict[str, DeviceSample] | None = None

    def _draw(self) -> dict[str, float]:
        rng = self._rng
        return {
            "mem_fraction": rng.uniform(0.2, 1.0),
            "util": rng.uniform(0.0, 100.0),
            "power": _clamp(rng.normalvariate(200.0, 50.0), "power"),
            "temperature": _clamp(rng.normalvariate(90.0, 20.0), "temperature"),
        }

    def _advance(self, previous: dict[str, float] | None) -> dict[str, float]:
        if previous is None or self._smoothing == "none":
            return self._draw()
        if self._smoothing == "ema":
            draw = self._draw()
            return {
                name: _clamp(previous[name] + self._factor * (draw[name] - previous[name]), name)
                for name in _RANGES
            }
        stepped: dict[str, float] = {}
        for name, (low, high) in _RANGES.items():
            step = self._rng.gauss(0.0, self._factor * (high - low) / 4)
            stepped[name] = _clamp(previous[name] + step, name)
        return stepped

    def tick(self) -> dict[str, DeviceSample]:
        """Advance one collection tick and return every device's reading."""
        samples: dict[str, DeviceSample] = {}
        for device_id, memory_bytes in self._devices:
            state = self._advance(self._state.get(device_id))
            self._state[device_id] = state
            samples[device_id] = DeviceSample(
                mem_used=int(memory_bytes * state["mem_fraction"]),
                mem_total=memory_bytes,
                util=_one_decimal(state["util"]),
                power=_one_decimal(state["power"]),
                temperature=_one_decimal(state["temperature"]),
            )
        self._last = samples
        return samples

    def current(self) -> dict[str, DeviceSample]:
        """The latest tick's readings (one tick is taken if none happened yet)."""
        return self._last if self._last is not None else self.tick()
