"""The agent's stats collector tells the plugins that follow allocations what is held."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from accelshare.agent.stats import StatsCollector
from accelshare.common import Allocation

from ..accel.builders import FRACTIONAL, U, cpu_plugin, mock_plugin

D = Decimal
GPU1, GPU2 = f"{U}1", f"{U}2"


class Recording:
    """Wraps the mock plugin, keeping what it was told."""

    def __init__(self) -> None:
        self.plugin = mock_plugin("two-fgpu.toml", FRACTIONAL)
        self.told: list[dict[str, Allocation]] = []
        self.inventory = self.plugin.inventory
        self.kernel_resources = self.plugin.kernel_resources
        self.node_stats = self.plugin.node_stats
        self.kernel_stats = self.plugin.kernel_stats
        self.close = self.plugin.close

    def observe_allocations(self, allocations: Mapping[str, Allocation]) -> None:
        self.told.append(dict(allocations))
        self.plugin.observe_allocations(allocations)


def gpu_util(stats: object) -> dict[str | None, Decimal]:
    metrics = getattr(stats, "metrics", [])
    return {m.device_id: D(m.value) for m in metrics if m.name == "cuda_util"}


async def test_each_plugin_is_told_its_own_slots_before_the_tick() -> None:
    cuda = Recording()
    collector = StatsCollector({"cuda": cuda, "cpu": cpu_plugin()}, "agent-1")
    held = {
        "k1": {"cpu": {"0": D(1)}, "cuda.shares": {GPU1: D("0.5")}},
        "k2": {"cpu": {"1": D(1)}},  # no GPU: told as holding nothing of it
    }
    stats = await collector.node_stats(held)
    assert cuda.told == [{"k1": {"cuda.shares": {GPU1: D("0.5")}}, "k2": {}}]
    util = gpu_util(stats)
    assert util[GPU1] >= 35  # 0.5 × U(70, 100)
    assert util[GPU2] == 0  # free
    await collector.node_stats({})  # every kernel gone: the GPU's work stops
    assert gpu_util(await collector.node_stats({}))[GPU1] == 0
    await collector.node_stats()  # None: nothing said, the last allocations stand
    assert len(cuda.told) == 3
