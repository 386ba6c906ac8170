"""The daemons' log set-up: the HTTP client's per-request lines only at debug."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from accelshare.logs import CHATTY_LOGGERS, configure_logging


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    levels = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _request_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    # configure_logging replaced the root's handlers (caplog's too): capture again
    logging.getLogger().addHandler(caplog.handler)
    transport = httpx.MockTransport(lambda request: httpx.Response(204))
    with caplog.at_level(logging.NOTSET), httpx.Client(transport=transport) as client:
        caplog.clear()
        client.post("http://agent.invalid/internal/agents/heartbeat")
    return [r.getMessage() for r in caplog.records if r.name.startswith("httpx")]


@pytest.mark.parametrize("level", ["info", "warning", "error"])
def test_request_lines_are_hidden_above_debug(level: str, caplog: pytest.LogCaptureFixture) -> None:
    configure_logging(level)
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    assert _request_lines(caplog) == []


def test_request_lines_are_shown_at_debug_even_after_a_quieter_set_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configure_logging("info")
    configure_logging("debug")
    lines = _request_lines(caplog)
    assert any(
        "HTTP Request: POST http://agent.invalid/internal/agents/heartbeat" in line
        for line in lines
    ), lines
