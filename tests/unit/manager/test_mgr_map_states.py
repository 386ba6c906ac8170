"""The snapshot's per-device maps (:func:`map_states_from_views`): every device is
``device_taken_amount`` of the agent's report and the manager's own kernels, capped at
its capacity; devices held under a renamed slot (legacy) are full; a view of an
unknown kind is left out.  The snapshot parses the report once per heartbeat and
recomputes only the devices where a kernel is reported or the manager holds something;
the property below checks that against the plain per-device rule."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelshare.common import AllocationMode, SlotTypes
from accelshare.manager.scheduler.snapshot import (
    map_states_from_views,
    parse_views,
    parse_views_text,
)
from accelshare.protocol import DeviceView, PluginMapView
from accelshare.sched.fit import DeviceState, MapState, device_taken_amount

D = Decimal
KERNELS = ("k1", "k2", "k3", "k4")


def reference(
    views: dict[str, PluginMapView],
    manager_allocs: dict[str, dict[str, Decimal]],
    known: frozenset[str],
) -> tuple[MapState, ...]:
    """The rule, device by device, with nothing reused."""
    states = []
    for key, view in views.items():
        if view.kind not in ("discrete", "fractional"):
            continue
        legacy = {d for per in view.legacy_allocations.values() for d, v in per.items() if D(v) > 0}
        devices = []
        for d in view.devices:
            capacity = D(d.capacity)
            allocated = device_taken_amount(
                D(d.allocated),
                {k: D(v) for k, v in d.kernels.items() if k in known},
                manager_allocs.get(d.slot_name, {}).get(d.device_id, D(0)),
                known,
            )
            if d.device_id in legacy:
                allocated = capacity
            devices.append(
                DeviceState(
                    d.device_id,
                    d.slot_name,
                    SlotTypes(d.slot_type),
                    capacity,
                    min(allocated, capacity),
                    d.numa_node,
                )
            )
        states.append(
            MapState(
                key,
                AllocationMode(view.kind),
                tuple(devices),
                strategy=view.strategy,
                quantum=D(view.quantum) if view.quantum else None,
                exclusive_slot_types=tuple(view.exclusive_slot_types),
            )
        )
    return tuple(states)


amounts = st.sampled_from(["0", "0.1", "0.25", "0.5", "1", "1.5", "2"])


@st.composite
def cases(
    draw: st.DrawFn,
) -> tuple[dict[str, PluginMapView], dict[str, dict[str, Decimal]], frozenset[str]]:
    views: dict[str, PluginMapView] = {}
    manager: dict[str, dict[str, Decimal]] = {}
    for key, slot, kind in (
        ("cuda", "cuda.shares", draw(st.sampled_from(["fractional", "discrete", "quantum"]))),
        ("cpu", "cpu", "discrete"),
    ):
        if not draw(st.booleans()):
            continue
        devices = []
        for i in range(draw(st.integers(1, 4))):
            device = f"{key}{i}"
            kernels = draw(st.dictionaries(st.sampled_from(KERNELS), amounts, max_size=3))
            devices.append(
                DeviceView(
                    device_id=device,
                    slot_name=slot,
                    slot_type=SlotTypes.COUNT,
                    capacity=draw(st.sampled_from(["1", "1.0", "2"])),
                    allocated=draw(amounts),
                    numa_node=draw(st.sampled_from([None, 0, 1])),
                    kernels=kernels,
                )
            )
            if draw(st.booleans()):
                manager.setdefault(slot, {})[device] = D(draw(amounts))
        legacy = {slot: {d.device_id: "1" for d in devices if draw(st.integers(0, 5)) == 0}}
        views[key] = PluginMapView(
            key=key,
            kind=kind,  # "quantum": a kind this manager does not know
            strategy=draw(st.sampled_from(["EVENLY", "FILL"])),
            quantum="0.1" if kind == "fractional" else None,
            devices=devices,
            legacy_allocations=legacy,
        )
    known = frozenset(draw(st.sets(st.sampled_from(KERNELS))))
    return views, manager, known


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_map_states_follow_the_per_device_rule(
    case: tuple[dict[str, PluginMapView], dict[str, dict[str, Decimal]], frozenset[str]],
) -> None:
    views, manager, known = case
    assert map_states_from_views(views, manager, known) == reference(views, manager, known)


def gpu(device: str, allocated: str, **kernels: str) -> DeviceView:
    return DeviceView(
        device_id=device,
        slot_name="cuda.shares",
        slot_type=SlotTypes.COUNT,
        capacity="1",
        allocated=allocated,
        kernels=kernels,
    )


def test_an_untouched_device_keeps_its_reported_state_and_the_rest_are_merged() -> None:
    view = PluginMapView(
        key="cuda",
        kind="fractional",
        strategy="EVENLY",
        quantum="0.1",
        devices=[
            gpu("GPU1", "0.7", k1="0.2", stranger="0.5"),
            gpu("GPU2", "0.3"),
            gpu("GPU3", "0"),
        ],
    )
    (state,) = map_states_from_views(
        {"cuda": view}, {"cuda.shares": {"GPU1": D("0.4"), "GPU3": D("0.9")}}, frozenset({"k1"})
    )
    # GPU1: the manager's 0.4 plus the stranger's 0.5; GPU2: as reported (legacy holding);
    # GPU3: the manager's kernels only
    assert [d.allocated for d in state.devices] == [D("0.9"), D("0.3"), D("0.9")]


BROKEN = [
    {"kind": "fractional"},  # no key, no devices
    {"key": "x", "kind": "discrete", "strategy": "FILL", "devices": [{"device_id": 1}]},
    "not a view",
    None,
]


@settings(max_examples=200, deadline=None)
@given(case=cases(), broken=st.lists(st.sampled_from(BROKEN), max_size=2))
def test_views_from_the_stored_text_are_the_views_entry_by_entry(
    case: tuple[dict[str, PluginMapView], dict[str, dict[str, Decimal]], frozenset[str]],
    broken: list[object],
) -> None:
    # the snapshot validates an agent's stored text in one go; a broken entry makes it
    # fall back to the entry-by-entry parse, which skips just that entry
    stored: dict[str, object] = {k: v.model_dump(mode="json") for k, v in case[0].items()}
    for n, entry in enumerate(broken):
        stored[f"broken{n}"] = entry
    text = json.dumps(stored)
    parsed = parse_views_text(text)
    assert parsed == parse_views(json.loads(text))
    assert parsed == case[0]


@pytest.mark.parametrize("text", [None, "", "null", "{}", "[]", "[1, 2]", '"views"', "3"])
def test_stored_views_that_are_no_object_are_no_views(text: str | None) -> None:
    assert parse_views_text(text) == {}
