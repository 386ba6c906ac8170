"""Stored JSON texts, their parses and the entries kept between passes (:class:`SnapshotCache`).

What is *derived* from rows is cached between passes (one :class:`SnapshotCache` per
scaling group, in the scheduler's process) but never what is *read*: a cached parse is
reused only when the stored text (and every other input of the parse) is exactly the
one the entry was built from.  :class:`Texts` shares one pass's parses of stored JSON
texts with the next pass; :func:`keep_current` keeps the entries whose revision is the
one just read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from accelshare.sched.images import ImageRequirement
from accelshare.sched.model import PendingSession
from accelshare.sched.snapshot import AgentSnapshot

if TYPE_CHECKING:
    from .agents import AgentColumns

__all__ = ["SnapshotCache", "Texts", "keep_current"]

_T = TypeVar("_T")


@dataclass(slots=True)
class SnapshotCache:
    """What a scaling group's passes derived from rows, keyed by those rows' stored text.

    * ``agents``: agent id -> (key, :class:`AgentSnapshot`); the key is the agent's
      columns the snapshot reads (JSON as stored text), its resource-occupying kernels'
      ids / slots / per-device allocations (stored text) and which of the kernels its
      heartbeat reports the manager has rows for;
    * ``pending``: session id -> (key, :class:`PendingSession`); the key is the row's
      columns (JSON as stored text) but ``retries``, its dependencies and its image's
      requirement;
    * ``texts``: stored JSON text -> parsed value (``ResourceSlot``, allocations, views),
      rebuilt every pass from the texts that pass used.

    Never a source of truth: the rows are read every pass, a key that differs is parsed
    again, and entries of rows that were not read are dropped (memory bounded by the
    group's live rows).
    """

    agents: dict[str, tuple[tuple[Any, ...], AgentSnapshot]] = field(default_factory=dict)
    inputs: dict[str, tuple[tuple[Any, Any], AgentColumns]] = field(default_factory=dict)
    # agent id -> (version, its held kernels' text): PostgreSQL (digest of the kernels'
    # row versions, text), SQLite (held revision, text or None: no held kernels)
    held_versions: dict[str, tuple[Any, str | None]] = field(default_factory=dict)
    pending: dict[Any, tuple[tuple[Any, ...], PendingSession]] = field(default_factory=dict)
    rows: dict[Any, tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    catalogue: dict[str, ImageRequirement] = field(default_factory=dict)  # pending's images
    # what ``pending``'s entries depend on beyond each row's revision, as of the last
    # pass: (retries read, default fragmentation option, dependencies, image catalogue)
    pending_inputs: tuple[Any, ...] | None = None
    texts: dict[tuple[str, str], Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def clear(self) -> None:
        self.agents.clear()
        self.rows.clear()
        self.inputs.clear()
        self.held_versions.clear()
        self.pending.clear()
        self.pending_inputs = None
        self.texts.clear()
        self.catalogue.clear()


class Texts:
    """Parses of stored JSON texts for one pass: reused from the previous pass's, kept
    for the next one only if this pass used them."""

    def __init__(self, previous: Mapping[tuple[str, str], Any]) -> None:
        self.previous = previous
        self.used: dict[tuple[str, str], Any] = {}

    def get_raw(self, kind: str, text: str, parse: Callable[[str], _T]) -> _T:
        """:meth:`get` for a text that is not JSON: ``parse`` gets the text itself."""
        key = (kind, text)
        try:
            return cast(_T, self.used[key])
        except KeyError:
            pass
        value = self.previous[key] if key in self.previous else parse(text)
        self.used[key] = value
        return cast(_T, value)

    def get(self, kind: str, text: str | None, parse: Callable[[Any], _T]) -> _T:
        key = (kind, text or "null")
        try:
            return cast(_T, self.used[key])
        except KeyError:
            pass
        value = self.previous[key] if key in self.previous else parse(json.loads(key[1]))
        self.used[key] = value
        return cast(_T, value)


_K = TypeVar("_K")


_R = TypeVar("_R")


_V = TypeVar("_V")


def keep_current(
    previous: Mapping[_K, tuple[_R, _V]], heads: Iterable[tuple[_K, _R]]
) -> tuple[dict[_K, tuple[_R, _V]], list[_K]]:
    """The entries of ``previous`` (key -> (revision, value)) whose revision is the one
    just read in ``heads``, and the keys to read again (in ``heads``' order).  Keys not
    in ``heads`` are dropped."""
    kept: dict[_K, tuple[_R, _V]] = {}
    stale: list[_K] = []
    for key, revision in heads:
        entry = previous.get(key)
        if entry is not None and entry[0] == revision:
            kept[key] = entry
        else:
            stale.append(key)
    return kept, stale
