"""The execute API's agent side: runs in a live kernel (agent/runs.py) over the agent RPC."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

Factory = Any


@pytest.fixture
async def agent(agent_toml: Factory, set_mode: Factory, start_agent: Factory) -> Any:
    path = agent_toml()
    await set_mode(path, "fractional")
    return await start_agent(path)


async def _kernel(agent: Any, image: str = "python") -> str:
    kernel_id = f"exec-{uuid.uuid4().hex[:10]}"
    report = await agent.create(kernel_id, {"cpu": "1", "mem": "1g"}, image=image)
    assert report["status"] == "RUNNING", report
    return kernel_id


async def _step(agent: Any, kernel_id: str, **body: Any) -> tuple[int, dict[str, Any]]:
    response = await agent.client.post(f"/v1/kernels/{kernel_id}/execute", json=body)
    return response.status_code, response.json()


async def _until_finished(agent: Any, kernel_id: str, first: dict[str, Any]) -> list[Any]:
    """Every result of a run from ``first`` on, continuing until it finishes."""
    results = [first]
    while results[-1]["status"] != "finished":
        code, body = await _step(
            agent, kernel_id, mode="continue", runId=first["runId"], flushTimeout=2
        )
        assert code == 200, body
        results.append(body)
    return results


def _text(results: list[dict[str, Any]], stream: str) -> str:
    return "".join(t for r in results for s, t in r["console"] if s == stream)


async def test_a_query_runs_the_code_with_the_environments_interpreter(agent: Any) -> None:
    kernel_id = await _kernel(agent)
    code = "import sys; print('out', sys.executable); print('err', file=sys.stderr); sys.exit(3)"
    status, first = await _step(agent, kernel_id, mode="query", code=code, flushTimeout=5)
    assert status == 200, first
    results = await _until_finished(agent, kernel_id, first)
    assert results[-1]["exitCode"] == 3
    assert _text(results, "stdout").startswith("out /")
    assert _text(results, "stderr") == "err\n"
    # the run is over: its id is unknown from now on
    status, gone = await _step(agent, kernel_id, mode="continue", runId=first["runId"])
    assert status == 404, gone
    assert first["runId"] in gone["detail"]


async def test_output_is_streamed_across_steps_and_input_reaches_the_command(agent: Any) -> None:
    kernel_id = await _kernel(agent)
    code = "import time; print('a', flush=True); x = input(); print(x * 2)"
    status, first = await _step(
        agent, kernel_id, mode="query", code=code, runId="my-run", flushTimeout=1
    )
    assert status == 200, first
    assert first["runId"] == "my-run"
    assert first["status"] == "continued"  # it waits for its input
    assert first["console"] == [["stdout", "a\n"]]
    status, again = await _step(agent, kernel_id, mode="query", code="1", runId="my-run")
    assert status == 409, again  # the id is in use
    status, fed = await _step(agent, kernel_id, mode="input", code="xy", runId="my-run")
    assert status == 200, fed
    results = await _until_finished(agent, kernel_id, fed)
    assert (_text(results, "stdout"), results[-1]["exitCode"]) == ("xyxy\n", 0)


async def test_a_batch_runs_build_then_exec_through_the_shell_in_the_kernel(agent: Any) -> None:
    kernel_id = await _kernel(agent, image="shell")
    options = {"build": "echo built > made.txt; echo building", "exec": "cat made.txt; exit 4"}
    status, first = await _step(agent, kernel_id, mode="batch", options=options, flushTimeout=5)
    assert status == 200, first
    results = [first]
    while results[-1]["status"] not in ("build-finished", "finished"):
        results += [(await _step(agent, kernel_id, mode="continue", runId=first["runId"]))[1]]
    assert (results[-1]["status"], results[-1]["exitCode"]) == ("build-finished", 0)
    assert _text(results, "stdout") == "building\n"
    status, cont = await _step(agent, kernel_id, mode="continue", runId=first["runId"])
    assert status == 200, cont
    rest = await _until_finished(agent, kernel_id, cont)
    assert (_text(rest, "stdout"), rest[-1]["exitCode"]) == ("built\n", 4)

    # "*" (Backend.AI's "the default", as `backend.ai run FILES --exec CMD` sends it) for
    # clean and build: the environment declares none, so nothing runs before exec
    starred = {"clean": "*", "build": " * ", "exec": "echo ran; exit 5"}
    status, first = await _step(agent, kernel_id, mode="batch", options=starred, flushTimeout=5)
    assert status == 200, first
    results = await _until_finished(agent, kernel_id, first)
    assert [r["status"] for r in results if r["status"] != "continued"] == ["finished"]
    assert (_text(results, "stdout"), results[-1]["exitCode"]) == ("ran\n", 5)

    # a failed build ends the run with its code; exec does not run
    failing = {"build": "echo nope >&2; exit 2", "exec": "echo never"}
    status, first = await _step(agent, kernel_id, mode="batch", options=failing, flushTimeout=5)
    results = await _until_finished(agent, kernel_id, first)
    assert results[-1]["exitCode"] == 2
    assert (_text(results, "stderr"), _text(results, "stdout")) == ("nope\n", "")


async def test_runs_run_inside_the_kernels_sandbox_as_its_user(
    agent: Any, sandbox_support: str | None
) -> None:
    kernel_id = await _kernel(agent)
    code = "import os; print(os.getuid(), os.getcwd(), os.path.exists('/etc/accelshare'))"
    _, first = await _step(agent, kernel_id, mode="query", code=code, flushTimeout=5)
    results = await _until_finished(agent, kernel_id, first)
    uid, cwd, etc = _text(results, "stdout").split()
    assert cwd.endswith("/work")
    if sandbox_support is None and os.geteuid() == 0:  # sandboxed as root: the kernel uid
        assert uid == "1000"
        assert etc == "False"


async def test_refusals_name_the_reason(agent: Any) -> None:
    kernel_id = await _kernel(agent, image="shell")
    status, body = await _step(agent, kernel_id, mode="continue", runId="nosuch")
    assert (status, body["type"]) == (404, "/problems/run-not-found")
    status, body = await _step(agent, "exec-nosuchkernel", mode="query", code="true")
    assert status == 404, body
    assert "not running" in body["detail"]
    status, body = await _step(agent, kernel_id, mode="batch", options={"exec": "*"})
    assert status == 409, body
    assert "options.exec" in body["detail"]
    status, body = await _step(agent, kernel_id, mode="batch", options={"build": "true"})
    assert status == 409, body
    status, body = await _step(agent, kernel_id, mode="query", code="x\u0000y")
    assert status == 400, body
    status, body = await _step(agent, kernel_id, mode="query", code="1", runId="bad id!")
    assert status == 400, body
    # at most 8 runs at a time in one kernel
    for n in range(8):
        status, body = await _step(
            agent, kernel_id, mode="query", code="sleep 30", runId=f"r{n}", flushTimeout=0
        )
        assert (status, body["status"]) == (200, "continued"), body
    status, body = await _step(agent, kernel_id, mode="query", code="true", flushTimeout=0)
    assert status == 409, body
    # destroying the kernel ends its runs
    await agent.destroy(kernel_id)
    status, body = await _step(agent, kernel_id, mode="continue", runId="r0")
    assert status == 404, body
