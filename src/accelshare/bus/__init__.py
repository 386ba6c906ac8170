"""The event and live-stats bus: Redis when configured, in-process otherwise.

See :mod:`.settings` (how it is chosen), :mod:`.redis_bus` (keys and guarantees),
:mod:`.messages` (what travels) and docs/operations.md.
"""

from .gap import Gap, GapTracker
from .messages import StatsReport
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
    "StatsReport",
    "load_bus_settings",
]
