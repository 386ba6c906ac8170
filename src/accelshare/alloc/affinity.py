"""NUMA affinity: in which order a map considers its devices.

Without a hint a map orders a slot's devices by free amount, most free first, ties
in declaration order.  With a hint (the agent allocating one kernel over several
maps) the NUMA nodes already chosen steer the order:

* **first kind** (hint without nodes): devices are grouped by NUMA node, the
  least-used group first; ``PREFER_SINGLE_NODE`` concatenates the groups,
  ``INTERLEAVED`` takes one device from each group in turn.
* **later kinds** (hint with the nodes the previous kind got): devices on those
  nodes come first (primary, grouped per node in hint order and combined by the
  policy), all other devices after them (secondary, most free first).

Inside a group devices are most free first.  Example, four GPUs, node 0 = g0 g1,
node 1 = g2 g3, all free::

    no hint                      -> g0 g1 g2 g3
    first kind, INTERLEAVED      -> g0 g2 g1 g3
    first kind, PREFER_SINGLE    -> g0 g1 g2 g3
    hint nodes (1,), INTERLEAVED -> g2 g3 g0 g1

(:func:`affinity_tiers` runs this example as a doctest.)

Besides the walk order (used by FILL and by discrete EVENLY), the same function gives
the *tiers* fractional EVENLY tries in turn: it first looks for a placement inside
the preferred devices and widens to all devices only when they cannot hold it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import chain, zip_longest

from .errors import parse_enum_member

__all__ = [
    "AffinityHint",
    "AffinityPolicy",
    "affinity_tiers",
    "most_free_first",
    "numa_groups",
    "walk_order",
]

NumaNode = int | None


class AffinityPolicy(enum.Enum):
    """How NUMA node groups are combined (agent.toml ``affinity-policy``)."""

    PREFER_SINGLE_NODE = "PREFER_SINGLE_NODE"
    INTERLEAVED = "INTERLEAVED"

    @classmethod
    def parse(cls, value: AffinityPolicy | str) -> AffinityPolicy:
        return parse_enum_member(cls, value, field="affinity_policy", what="affinity policy")


@dataclass(frozen=True, slots=True)
class AffinityHint:
    """NUMA nodes chosen by the kinds allocated before (empty for the first kind).

    ``AffinityHint()`` asks for NUMA grouping of the first kind;
    ``AffinityHint((0,))`` says "the GPUs went to node 0, prefer node 0 now".
    """

    numa_nodes: tuple[NumaNode, ...] = ()
    policy: AffinityPolicy = AffinityPolicy.INTERLEAVED

    def __post_init__(self) -> None:
        # Deduplicate but keep the order: it decides which primary group comes first.
        object.__setattr__(self, "numa_nodes", tuple(dict.fromkeys(self.numa_nodes)))
        if type(self.policy) is not AffinityPolicy:  # a member needs no parsing
            object.__setattr__(self, "policy", AffinityPolicy.parse(self.policy))


def most_free_first(devices: Sequence[str], spare: Mapping[str, int]) -> list[str]:
    """Most free first; ties keep the given (declaration) order.

    ``sorted`` stays stable with ``reverse=True``: equal keys keep their input order.
    """
    return sorted(devices, key=spare.__getitem__, reverse=True)


def numa_groups(devices: Sequence[str], numa: Mapping[str, NumaNode]) -> dict[NumaNode, list[str]]:
    """The devices of each NUMA node, nodes and devices in declaration order."""
    groups: dict[NumaNode, list[str]] = {}
    for device in devices:
        groups.setdefault(numa.get(device), []).append(device)
    return groups


def _groups(
    members: Mapping[NumaNode, Sequence[str]], spare: Mapping[str, int]
) -> dict[NumaNode, list[str]]:
    return {node: most_free_first(group, spare) for node, group in members.items()}


def _least_used_first(
    groups: Mapping[NumaNode, list[str]], used: Mapping[str, Decimal]
) -> list[list[str]]:
    """The groups, least-used first; dicts keep first appearance, so ties stay in
    declaration order."""
    return sorted(groups.values(), key=lambda g: sum((used[d] for d in g), Decimal(0)))


def _combine(groups: Sequence[list[str]], policy: AffinityPolicy) -> list[str]:
    if policy is AffinityPolicy.PREFER_SINGLE_NODE:
        return list(chain.from_iterable(groups))
    return [d for row in zip_longest(*groups) for d in row if d is not None]


def affinity_tiers(
    devices: Sequence[str],
    spare: Mapping[str, int],
    used: Mapping[str, Decimal],
    numa: Mapping[str, NumaNode],
    hint: AffinityHint | None,
    members: Mapping[NumaNode, Sequence[str]] | None = None,
) -> list[list[str]]:
    """Candidate tiers, narrowest first; the last tier is the full walk order.

    ``devices`` is in declaration order, ``spare`` the free units per device and
    ``used`` the allocated amount per device (to find the least-used node group);
    ``members`` is :func:`numa_groups` of ``devices`` when the caller keeps it.

    Worked example, the four GPUs of the module docstring (node 0 = g0 g1,
    node 1 = g2 g3), all free:

    >>> gpus = ["g0", "g1", "g2", "g3"]
    >>> numa = {"g0": 0, "g1": 0, "g2": 1, "g3": 1}
    >>> spare = dict.fromkeys(gpus, 10)
    >>> used = dict.fromkeys(gpus, Decimal(0))
    >>> affinity_tiers(gpus, spare, used, numa, None)
    [['g0', 'g1', 'g2', 'g3']]
    >>> affinity_tiers(gpus, spare, used, numa, AffinityHint())
    [['g0', 'g2', 'g1', 'g3']]
    >>> affinity_tiers(gpus, spare, used, numa, AffinityHint((1,)))
    [['g2', 'g3'], ['g2', 'g3', 'g0', 'g1']]

    With ``PREFER_SINGLE_NODE`` each node is a tier of its own, tried before the full
    walk.  Once g0 holds 4 units, node 1 is the least used and comes first, and g0
    (4 units less free) sorts after g1 inside node 0:

    >>> spare["g0"], used["g0"] = 6, Decimal(4)
    >>> prefer = AffinityHint(policy=AffinityPolicy.PREFER_SINGLE_NODE)
    >>> affinity_tiers(gpus, spare, used, numa, prefer)
    [['g2', 'g3'], ['g1', 'g0'], ['g2', 'g3', 'g1', 'g0']]
    """
    if hint is None:
        return [most_free_first(devices, spare)]
    groups = _groups(members if members is not None else numa_groups(devices, numa), spare)
    if not hint.numa_nodes:
        ordered = _least_used_first(groups, used)
        full = _combine(ordered, hint.policy)
        if hint.policy is AffinityPolicy.PREFER_SINGLE_NODE:
            return _dedupe([*ordered, full])
        return [full]
    primary_groups = [groups[node] for node in hint.numa_nodes if node in groups]
    primary = _combine(primary_groups, hint.policy)
    chosen = set(primary)
    secondary = most_free_first([d for d in devices if d not in chosen], spare)
    tiers = [*primary_groups] if hint.policy is AffinityPolicy.PREFER_SINGLE_NODE else []
    return _dedupe([*tiers, primary, primary + secondary])


def walk_order(
    devices: Sequence[str],
    spare: Mapping[str, int],
    used: Mapping[str, Decimal],
    numa: Mapping[str, NumaNode],
    hint: AffinityHint | None,
    members: Mapping[NumaNode, Sequence[str]] | None = None,
) -> list[str]:
    """The last of :func:`affinity_tiers` (the full walk order, what FILL and discrete
    EVENLY walk) without working out the narrower tiers: only the hint's node groups
    are sorted, and no tier is compared with another.

    >>> gpus = ["g0", "g1", "g2", "g3"]
    >>> numa = {"g0": 0, "g1": 0, "g2": 1, "g3": 1}
    >>> walk_order(gpus, dict.fromkeys(gpus, 10), {}, numa, AffinityHint((1,)))
    ['g2', 'g3', 'g0', 'g1']
    """
    if hint is None:
        return most_free_first(devices, spare)
    groups = members if members is not None else numa_groups(devices, numa)
    if not hint.numa_nodes:
        return _combine(_least_used_first(_groups(groups, spare), used), hint.policy)
    nodes = [node for node in hint.numa_nodes if node in groups]
    primary = _combine([most_free_first(groups[node], spare) for node in nodes], hint.policy)
    if len(primary) == len(devices):
        return primary
    chosen = set(nodes)  # the rest in declaration order, then most free first (stable)
    return primary + most_free_first([d for d in devices if numa.get(d) not in chosen], spare)


def _dedupe(tiers: list[list[str]]) -> list[list[str]]:
    """Drop empty tiers and tiers holding the same devices as the one before."""
    result: list[list[str]] = []
    for tier in tiers:
        if tier and (not result or set(result[-1]) != set(tier)):
            result.append(tier)
    return result
