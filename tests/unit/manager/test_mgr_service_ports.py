"""Service-port declarations of a session (``config.service_ports``) and their env form."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from accelshare.api.schemas.sessions import CreateSessionBody
from accelshare.client.cli.args import ArgumentError, parse_services
from accelshare.manager.services.sessions.spec import service_ports_from_environ


def _body(ports: list[dict[str, Any]]) -> CreateSessionBody:
    return CreateSessionBody.model_validate({"image": "python", "config": {"service_ports": ports}})


def test_declared_ports_become_env_and_read_back() -> None:
    body = _body([{"name": "web", "port": 8080}, {"name": "jupyter_lab", "port": 8888}])
    env = {sp.env_name: str(sp.port) for sp in body.config.service_ports}
    assert env == {
        "BACKENDAI_SERVICE_PORT_WEB": "8080",
        "BACKENDAI_SERVICE_PORT_JUPYTER_LAB": "8888",
    }
    assert service_ports_from_environ({**env, "OTHER": "1"}) == [
        {"name": "jupyter_lab", "protocol": "http", "port": 8888},
        {"name": "web", "protocol": "http", "port": 8080},
    ]


def test_malformed_env_entries_are_not_services() -> None:
    assert service_ports_from_environ({"BACKENDAI_SERVICE_PORT_WEB": "x"}) == []
    assert service_ports_from_environ({"BACKENDAI_SERVICE_PORT_": "80"}) == []
    assert service_ports_from_environ(None) == []


@pytest.mark.parametrize(
    ("ports", "words"),
    [
        ([{"name": "Web", "port": 8080}], "a service name is 1-32 lower-case letters"),
        ([{"name": "web", "port": 80}], "greater than or equal to 1024"),
        ([{"name": "web", "port": 8080, "protocol": "udp"}], "'http'"),
        ([{"name": "web", "port": 8080}, {"name": "web", "port": 8081}], "the name 'web'"),
        ([{"name": "a", "port": 8080}, {"name": "b", "port": 8080}], "the port 8080"),
        ([{"name": "web", "port": 8080, "host": "x"}], "Extra inputs are not permitted"),
    ],
    ids=["name", "port", "protocol", "dup-name", "dup-port", "extra"],
)
def test_bad_declarations_are_refused(ports: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        _body(ports)


def test_cli_service_option() -> None:
    assert parse_services(["web=8080", "api=9000"]) == {"web": 8080, "api": 9000}
    assert parse_services(["web=1"]) == {"web": 1}  # the server checks the range
    for bad in ("web", "Web=80", "web=x", "web=-1"):
        with pytest.raises(ArgumentError, match="expected NAME=PORT"):
            parse_services([bad])
    with pytest.raises(ArgumentError, match="given twice"):
        parse_services(["web=1", "web=2"])
