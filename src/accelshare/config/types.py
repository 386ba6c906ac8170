"""Value types shared by the store front-end and its backends."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .keys import NestedDict

__all__ = ["ConfigScopes", "NestedDict", "WatchEvent", "WatchEventType"]


class ConfigScopes(enum.StrEnum):
    """Where a key lives.  ``MERGED`` is for reads only: node, then scaling group, then global."""

    MERGED = "merged"
    GLOBAL = "global"
    SCALING_GROUP = "sgroup"
    NODE = "node"


class WatchEventType(enum.StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change.  From a store: ``key`` is the stored key path relative to the watched
    scope (components quoted, e.g. ``config/a%20b``); from a backend: the full key."""

    key: str
    value: str  # "" for deletions
    event: WatchEventType
    revision: int
