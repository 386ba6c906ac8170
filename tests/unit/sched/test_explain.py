from accelshare.sched.explain import explain


def test_explain_pending_with_agents() -> None:
    text = explain(
        "PENDING",
        "No agent can hold the request now: ...",
        {
            "retries": 2,
            "last_try": "2026-01-01T00:00:00+00:00",
            "msg": "No agent can hold the request now",
            "failed_predicates": [],
            "passed_predicates": [{"name": "reserved_time"}, {"name": "concurrency"}],
            "agents": ["i-node01: no cuda.shares slot"],
        },
    )
    assert text.splitlines() == [
        "PENDING: No agent can hold the request now",
        "Tried 2 time(s), last at 2026-01-01T00:00:00+00:00.",
        "Checks passed: reserved_time, concurrency",
        "Agents:",
        "  i-node01: no cuda.shares slot",
    ]


def test_explain_failed_predicates_and_other_states() -> None:
    text = explain(
        "PENDING",
        None,
        {
            "msg": "Before start time",
            "failed_predicates": [{"name": "reserved_time", "msg": "Before start time (x)"}],
        },
    )
    assert "Checks failed:\n  reserved_time: Before start time (x)" in text
    assert explain("PENDING", None, None).startswith("PENDING: not looked at")
    assert explain("RUNNING", None, None) == "The session is RUNNING, not pending."
    assert (
        explain("CANCELLED", "kernel failed", None)
        == "The session is CANCELLED, not pending: kernel failed"
    )
