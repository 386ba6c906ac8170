"""The web console: static ES modules and CSS served by the manager (no build step).

:func:`install_console` mounts ``static/`` at ``/console/`` and makes ``GET /`` from a
browser (an ``Accept`` header naming ``text/html``) redirect there; API clients
(Backend.AI's SDK, ``accelshare``, curl) still get the version document at ``/``.
The console talks only to the public API with the login cookie (see docs/console.md).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CONSOLE_PATH", "STATIC_DIR", "RootRedirect", "install_console"]

STATIC_DIR = Path(__file__).parent / "static"
CONSOLE_PATH = "/console"


class RootRedirect:
    """ASGI middleware: a browser's ``GET /`` goes to the console (307)."""

    def __init__(self, app: ASGIApp, target: str = CONSOLE_PATH + "/") -> None:
        self.app = app
        self.target = target.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/"
            and scope["method"] in ("GET", "HEAD")
            and _wants_html(scope)
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 307,
                    "headers": [(b"location", self.target), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


def _wants_html(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"accept":
            return b"text/html" in value.lower()
    return False


def install_console(app: FastAPI) -> None:
    """Serve the console at ``/console/`` and send browsers there from ``/``."""
    app.mount(CONSOLE_PATH, StaticFiles(directory=STATIC_DIR, html=True), name="console")
    app.add_middleware(RootRedirect)
