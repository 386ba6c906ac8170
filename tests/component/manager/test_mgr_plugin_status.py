"""What an agent's plugins say of themselves (the cuda plugin: how fractions are
enforced, its MPS daemon) reaches the agent's record and ``accelshare agent info``."""

from __future__ import annotations

from accelshare.client.cli.agent import _plugin_status_rows

from .cluster import Cluster


async def test_plugin_status_follows_the_heartbeats(cluster: Cluster) -> None:
    agent = await cluster.add_agent("i-node01")
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert "status" not in detail["computePlugins"]["cuda"]  # nothing said yet
    agent.plugin_status = {"cuda": {"enforcement": "mps", "mps": "running (pid 4242, 0 restarts)"}}
    await agent.heartbeat()
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["computePlugins"]["cuda"]["status"] == agent.plugin_status["cuda"]
    agent.plugin_status = {"cuda": {"enforcement": "mps", "mps": "restarting"}}
    await agent.heartbeat()
    detail = (await cluster.admin.get("/agents/i-node01")).json()
    assert detail["computePlugins"]["cuda"]["status"]["mps"] == "restarting"
    assert _plugin_status_rows(detail["computePlugins"]) == [
        ("cuda enforcement", "mps"),
        ("cuda mps", "restarting"),
    ]


def test_agent_info_rows_skip_plugins_without_status() -> None:
    plugins = {
        "cpu": {"kind": "discrete"},
        "cuda": {"status": {"enforcement": "none (MPS unavailable: not found)"}},
        "odd": {"status": "not a table"},
    }
    assert _plugin_status_rows(plugins) == [
        ("cuda enforcement", "none (MPS unavailable: not found)")
    ]
