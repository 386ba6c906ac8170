"""Amounts through the real REST API: read exactly as written or refused by name
(docs/reliability.md, "Amounts"), never rounded."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .cluster import Cluster


def problem_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    return body


async def test_amounts_off_the_grid_or_malformed_are_refused_by_name(cluster: Cluster) -> None:
    await cluster.add_agent("i-fine", quantum=Decimal("0.01"))
    field = "config.resources.cuda.shares"

    off = problem_of(await cluster.create({"cuda.shares": "0.1004"}))
    assert (off["field"], off["expected"], off["received"]) == (
        field,
        "a multiple of 0.01",
        "0.1004",
    )
    assert (off["error"], off["quantum"], off["nearest"]) == (
        "NotMultipleOfQuantum",
        "0.01",
        ["0.1", "0.11"],
    )
    assert "nearest valid amounts: 0.1 and 0.11" in off["detail"]

    below = problem_of(await cluster.create({"cuda.shares": "0.0005"}))
    assert (below["error"], below["nearest"]) == ("BelowOneQuantum", ["0", "0.01"])
    assert "below one quantum (0.01)" in below["detail"]

    for value, words in ((True, "a decimal number"), ("1_0", "no '_'"), ("１", "ASCII digits")):
        bad = problem_of(await cluster.create({"cuda.shares": value}))
        assert (bad["field"], bad["received"]) == (field, value), value
        assert words in bad["expected"], (value, bad)

    # nothing was enqueued by any of them
    assert (await cluster.admin.get("/sessions")).json()["total"] == 0


async def test_a_json_number_is_read_as_written_not_as_a_float(cluster: Cluster) -> None:
    await cluster.add_agent("i-fine", quantum=Decimal("0.01"))
    # as a float this is 0.1 (on the grid); as written it is not
    text = (
        '{"image": "python:3.11", "config": {"resources": {"cuda.shares": 0.10000000000000000001}}}'
    )
    headers = {"content-type": "application/json"}
    refused = problem_of(await cluster.admin.post("/session", content=text, headers=headers))
    assert refused["field"] == "config.resources.cuda.shares"
    assert refused["nearest"] == ["0.1", "0.11"]

    accepted = await cluster.admin.post(
        "/session",
        content='{"image": "python:3.11", "config": {"resources": {"cuda.shares": 0.13}}}',
        headers=headers,
    )
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["session"]["requestedSlots"]["cuda.shares"] == "0.13"


async def test_admin_slot_amounts_use_the_same_parser(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")  # registers cuda.shares
    for value, words in (
        (True, "a decimal number"),
        ("1_0", "no '_'"),
        ("１", "ASCII digits"),
        ("0.0005", "at least 0.001"),
    ):
        response = await cluster.admin.post(
            "/admin/resource-policies",
            json={"name": "p", "total_resource_slots": {"cuda.shares": value}},
        )
        problem = problem_of(response)
        assert problem["field"] == "total_resource_slots.cuda.shares", (value, problem)
        assert words in problem["expected"], (value, problem)
    made = await cluster.admin.post(
        "/admin/resource-policies",
        json={"name": "p", "total_resource_slots": {"cuda.shares": "1.25", "cpu": "inf"}},
    )
    assert made.status_code == 201, made.text
