"""Why is a session still pending?  Readable text from the last pass's record (pure).

The manager stores each pass's verdict in ``status_data["scheduler"]`` (see
:meth:`accelshare.sched.outcome.Failure.scheduler_data`); ``GET /session/{id}/why`` and
``accelshare session why`` render it with :func:`explain`::

    PENDING: No agent can hold the request now: i-node01: cuda.shares needs 1.2, ...
    Tried 3 time(s), last at 2026-01-01T00:00:02+00:00.
    Checks passed: reserved_time, dependencies, concurrency, ...
    Agents:
      i-node01: cuda.shares needs 1.2, largest placement 0.8 (GPU1 0.4, GPU2 0.8 free)
      i-node02: no cuda.shares slot
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["explain"]


def explain(status: str, status_info: str | None, scheduler: Mapping[str, Any] | None) -> str:
    """A few lines saying why the session is (or is not) waiting."""
    if status != "PENDING":
        line = f"The session is {status}, not pending"
        return f"{line}: {status_info}" if status_info else line + "."
    data = scheduler or {}
    if not data:
        return "PENDING: not looked at by the scheduler yet (a pass runs within seconds)."
    lines = [f"PENDING: {data.get('msg') or status_info or 'no reason recorded'}"]
    retries, last_try = data.get("retries"), data.get("last_try")
    if retries is not None:
        lines.append(f"Tried {retries} time(s), last at {last_try}.")
    failed = data.get("failed_predicates") or []
    if failed:
        lines.append("Checks failed:")
        lines.extend(f"  {p.get('name')}: {p.get('msg')}" for p in failed)
    passed = data.get("passed_predicates") or []
    if passed:
        lines.append("Checks passed: " + ", ".join(str(p.get("name")) for p in passed))
    agents = data.get("agents") or []
    if agents:
        lines.append("Agents:")
        lines.extend(f"  {reason}" for reason in agents)
    return "\n".join(lines)
