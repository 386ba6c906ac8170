"""The agent's terminal WebSocket (``/v1/kernels/{id}/terminal``) on a real uvicorn
server: a shell on a pty inside a process kernel, with the kernel's environment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import websockets
from websockets.exceptions import ConnectionClosed

from accelshare.agent.rpc import create_rpc_app
from accelshare.agent.terminal_ws import SESSION_ENDED
from accelshare.protocol import CLUSTER_SECRET_HEADER
from accelshare_testkit.terminal import TerminalScreen
from accelshare_testkit.waiting import until

Factory = Callable[..., Any]
CLUSTER_SECRET = "component-test-cluster-secret"  # conftest.CLUSTER_SECRET
HEADERS = {CLUSTER_SECRET_HEADER: CLUSTER_SECRET}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        return server.started

    await until(started, "the RPC server to listen", timeout_s=10, interval_s=0.02)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def agent_url(
    agent_toml: Factory, set_mode: Factory, start_agent: Factory
) -> AsyncIterator[tuple[Any, str]]:
    path = agent_toml()
    await set_mode(path, "fractional")
    agent = await start_agent(path)
    async with serve(create_rpc_app(agent.service, secret=CLUSTER_SECRET)) as url:
        yield agent, url


async def _kernel(agent: Any, slots: dict[str, str] | None = None) -> str:
    kernel_id = f"term-{uuid.uuid4().hex[:10]}"
    report = await agent.create(kernel_id, slots or {"cpu": "1", "mem": "1g"})
    assert report["status"] == "RUNNING", report
    return kernel_id


async def test_a_terminal_runs_nvidia_smi_with_the_kernels_environment(
    agent_url: tuple[Any, str], scratch_root: Path
) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent, {"cpu": "1", "mem": "1g", "cuda.shares": "0.5"})
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal?cols=100&rows=30", additional_headers=HEADERS
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"echo kid=$ACCELSHARE_KERNEL_ID; pwd; stty size\r")
        await screen.until(f"kid={kernel_id}")
        await screen.until(str(scratch_root / kernel_id / "work"))
        await screen.until("30 100")
        await ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        await ws.send(json.dumps({"type": "data", "data": "stty size; nvidia-smi\r"}))
        await screen.until("40 120")
        # two-fgpu: 0.5 share of a 2 GiB GPU at unit_mem 2 GiB is 1024 MiB.
        await screen.until("1024MiB", timeout_s=15)
        await ws.send(b"exit 3\r")
        await screen.until_closed()
    assert screen.controls[-1] == {"type": "exit", "code": 3}


async def test_the_shell_joins_the_kernels_cgroup_or_rlimits(
    agent_url: tuple[Any, str], scratch_root: Path
) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    launch = json.loads((scratch_root / kernel_id / "state" / "launch.json").read_text())
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal", additional_headers=HEADERS
    ) as ws:
        screen = TerminalScreen(ws)
        if launch["procs_files"]:
            procs = launch["procs_files"][0]
            await ws.send(f"grep -qx $$ {procs} && echo IN-CGROUP\r".encode())
            await screen.until("IN-CGROUP")
        else:
            limit = launch["rlimits"][0][1]
            await ws.send(b"ulimit -d\r")  # RLIMIT_DATA in KiB
            await screen.until(str(limit // 1024))


async def test_bad_control_messages_are_answered_and_the_terminal_stays(
    agent_url: tuple[Any, str],
) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal", additional_headers=HEADERS
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(json.dumps({"type": "resize", "cols": "wide", "rows": 10}))
        await ws.send("not json")
        await ws.send(b"echo still-here\r")
        await screen.until("still-here")
    assert screen.controls == [
        {"type": "error", "detail": "cols: expected an integer, received 'wide'"},
        {
            "type": "error",
            "detail": "message: expected a JSON object such as "
            '{"type": "resize", "cols": 80, "rows": 24}, received \'not json\'',
        },
    ]


@pytest.mark.parametrize(
    ("headers", "path", "code"),
    [
        pytest.param({}, "{kid}/terminal", 4401, id="no-secret"),
        pytest.param({CLUSTER_SECRET_HEADER: "wrong" * 5}, "{kid}/terminal", 4401, id="wrong"),
        pytest.param(HEADERS, "nope/terminal", 4404, id="unknown-kernel"),
        pytest.param(HEADERS, "{kid}/terminal?cols=0", 4400, id="bad-size"),
    ],
)
async def test_refusals_close_with_a_reason(
    agent_url: tuple[Any, str], headers: dict[str, str], path: str, code: int
) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    async with websockets.connect(
        f"{url}/v1/kernels/" + path.format(kid=kernel_id), additional_headers=headers
    ) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code


async def test_a_destroyed_kernel_has_no_terminal(agent_url: tuple[Any, str]) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    await agent.destroy(kernel_id)
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal", additional_headers=HEADERS
    ) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4404


async def test_destroying_the_kernel_ends_its_open_terminal(agent_url: tuple[Any, str]) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal", additional_headers=HEADERS
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"echo ready\r")
        await screen.until("ready")
        await agent.destroy(kernel_id)
        await screen.until_closed()
    # The kernel's end, told apart from a shell that exits by itself (below).
    assert screen.controls[-1]["type"] == "ended", screen.controls
    assert screen.controls[-1]["detail"] == "the session ended"
    assert ws.close_code == SESSION_ENDED


async def test_a_shell_that_exits_is_not_the_sessions_end(agent_url: tuple[Any, str]) -> None:
    agent, url = agent_url
    kernel_id = await _kernel(agent)
    async with websockets.connect(
        f"{url}/v1/kernels/{kernel_id}/terminal", additional_headers=HEADERS
    ) as ws:
        screen = TerminalScreen(ws)
        await ws.send(b"exit 0\r")
        await screen.until_closed()
    assert screen.controls[-1] == {"type": "exit", "code": 0}
    assert ws.close_code == 1000
    assert agent.service.kernel_ended(kernel_id) is False  # the kernel runs on
