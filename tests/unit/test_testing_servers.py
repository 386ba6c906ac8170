"""The shared pieces of the throwaway test servers: finding a binary, stopping a process
that ignores SIGTERM, and the ``with`` protocol."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accelshare_testkit.servers import ServerProcess, find_binary, stop_process


def test_find_binary_prefers_the_variable_and_refuses_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake-server"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("ACCELSHARE_TEST_BINARY", str(fake))
    assert find_binary("ACCELSHARE_TEST_BINARY", "sh") == str(fake)
    monkeypatch.setenv("ACCELSHARE_TEST_BINARY", str(tmp_path / "absent"))
    assert find_binary("ACCELSHARE_TEST_BINARY", "sh") is None
    monkeypatch.delenv("ACCELSHARE_TEST_BINARY")
    found = find_binary("ACCELSHARE_TEST_BINARY", "sh")
    assert found is not None
    assert Path(found).name == "sh"
    assert find_binary("ACCELSHARE_TEST_BINARY", "no-such-server-binary-here") is None


def _child(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"  # its signal handler is in place
    return process


def test_stop_process_terminates_then_kills() -> None:
    polite = _child("import time; print('ready', flush=True); time.sleep(60)")
    stop_process(polite, grace_s=5)
    assert polite.returncode == -15  # SIGTERM was enough

    stubborn = _child(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(60)"
    )
    stop_process(stubborn, grace_s=0.2)
    assert stubborn.returncode == -9  # it ignored SIGTERM and was killed


def test_server_process_with_and_restart() -> None:
    calls: list[str] = []

    class Recorder(ServerProcess):
        def start(self) -> None:
            calls.append("start")

        def stop(self) -> None:
            calls.append("stop")

    with Recorder() as server:
        server.restart()
    assert calls == ["start", "stop", "start", "stop"]
    with pytest.raises(NotImplementedError):
        ServerProcess().start()
    with pytest.raises(NotImplementedError):
        ServerProcess().stop()
