"""``POST /session/{ref}/upload``, ``/download``, ``GET /session/{ref}/files`` on the
manager: who and when (the agent's side is tests/component/agent/test_agent_files.py,
the whole path with the official client tests/integration/compat/test_bai_session_files.py)."""

from __future__ import annotations

from typing import Any

Cluster = Any


async def test_a_session_not_running_is_409_naming_its_status(cluster: Cluster) -> None:
    created = await cluster.create({"cpu": "1", "mem": "1g"}, name="waiting")
    assert created.json()["status"] == "PENDING"  # no agent yet
    big = b"x" * (2 * 1024 * 1024)  # past the manager's 1 MiB body limit: not a 413
    answers = [
        await cluster.admin.post(
            "/session/waiting/upload", files=[("src", ("a.bin", big, "application/octet-stream"))]
        ),
        await cluster.admin.post("/session/waiting/download", json={"files": ["a.bin"]}),
        await cluster.admin.request("GET", "/session/waiting/files", json={"path": "."}),
    ]
    for response in answers:
        assert response.status_code == 409, response.text
        problem = response.json()
        assert problem["field"] == "session"
        assert problem["received"] == "PENDING"
        assert "PENDING" in problem["detail"]
    await cluster.admin.delete("/session/waiting")
    ended = await cluster.admin.get("/session/waiting/files", params={"path": "."})
    assert ended.status_code == 409
    assert ended.json()["received"] in ("CANCELLED", "TERMINATED")


async def test_unknown_sessions_and_bad_requests(cluster: Cluster) -> None:
    missing = await cluster.admin.get("/session/nosuch/files")
    assert missing.status_code == 404
    body = await cluster.admin.post(
        "/session/nosuch/upload", content=b"{}", headers={"content-type": "application/json"}
    )
    assert body.status_code == 404  # the session is looked up first
    # other routes under /session are still held to the 1 MiB limit
    huge = await cluster.admin.post("/session/nosuch/rename", content=b"x" * (2 * 1024 * 1024))
    assert huge.status_code == 413
