"""``accelshare session info`` lists the app services with their allocated host ports."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from accelshare.client.cli import app
from accelshare.client.cli import session as session_cli
from accelshare.client.models import SessionInfo

SESSION = {
    "sessionId": "0f4c1a52-2f7a-4a51-9c1e-000000000001",
    "sessionName": "nb1",
    "status": "RUNNING",
    "servicePorts": [
        {"name": "lab", "protocol": "http", "port": 8889},
        {"name": "web", "protocol": "http", "port": 8888, "hostPort": 30001},
    ],
}


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    def fake_call_api(work: Any, **_: Any) -> SessionInfo:
        return SessionInfo.model_validate(SESSION)

    monkeypatch.setattr(session_cli, "call_api", fake_call_api)
    return SESSION


def test_info_shows_each_service_and_its_host_port(shown: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["session", "info", "nb1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "web (http, port 8888, host port 30001)" in result.output
    assert "lab (http, port 8889, host port -)" in result.output  # not reported yet


def test_info_json_keeps_the_host_ports(shown: dict[str, Any]) -> None:
    info = SessionInfo.model_validate(shown)
    assert info.to_json()["servicePorts"] == shown["servicePorts"]
