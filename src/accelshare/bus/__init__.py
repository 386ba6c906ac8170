"""The event and live-stats bus: Redis when configured, in-process otherwise.

See :mod:`.settings` (how it is chosen), :mod:`.redis_bus` (keys and guarantees),
and docs/operations.md; what travels is :mod:`accelshare.protocol` (kernel events as a
``KernelEventBatch``, statistics as a ``StatsReport``).
"""

from .gap import Gap, GapTracker
from .redis_bus import EVENTS_GROUP, BusUnavailable, RedisBus
from .settings import BusSettings, RedisSettings, load_bus_settings

__all__ = [
    "EVENTS_GROUP",
    "BusSettings",
    "BusUnavailable",
    "Gap",
    "GapTracker",
    "RedisBus",
    "RedisSettings",
    "load_bus_settings",
]
