"""Drive a terminal WebSocket from tests (``websockets`` client)::

async with websockets.connect(url, additional_headers=headers) as ws:
    screen = TerminalScreen(ws)
    await ws.send(b"echo hi\\r")
    await screen.until("hi", timeout_s=10)
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

__all__ = ["TerminalScreen"]


class TerminalScreen:
    """Everything the terminal printed so far (decoded, with control messages apart)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.text = ""
        self.controls: list[dict[str, Any]] = []

    async def _receive(self, timeout_s: float) -> bool:
        """One frame; ``False`` once the connection is closed."""
        try:
            frame = await asyncio.wait_for(self.ws.recv(), timeout_s)
        except TimeoutError:
            return True
        except Exception as e:
            if type(e).__name__.startswith("ConnectionClosed"):
                return False
            raise
        if isinstance(frame, bytes):
            self.text += frame.decode(errors="replace")
        else:
            self.controls.append(json.loads(frame))
        return True

    async def until(self, needle: str, *, timeout_s: float = 10.0) -> str:
        """Read until ``needle`` was printed; ``AssertionError`` with the screen otherwise."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.text:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._receive(min(left, 0.5)):
                if needle in self.text:
                    break
                raise AssertionError(
                    f"timed out after {timeout_s:g} s waiting for {needle!r}; "
                    f"the terminal showed {self.text[-2000:]!r}"
                )
        return self.text

    async def until_closed(self, *, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while await self._receive(max(0.01, min(deadline - time.monotonic(), 0.5))):
            if time.monotonic() >= deadline:
                raise AssertionError(f"the terminal is still open after {timeout_s:g} s")
