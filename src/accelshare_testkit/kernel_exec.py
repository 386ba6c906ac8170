"""Run a command in a running kernel from tests and collect everything it printed::

result = await run_in_kernel(runtime, kernel_id, ["sh", "-c", "id -u"])
assert result.code == 0 and result.stdout == "1000\\n"
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from accelshare.agent.runtime.execs import ExecSource

__all__ = ["ExecResult", "run_in_kernel"]


@dataclass(frozen=True, slots=True)
class ExecResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout, then stderr."""
        return self.stdout + self.stderr


async def run_in_kernel(
    runtime: ExecSource,
    kernel_id: str,
    argv: Sequence[str],
    *,
    stdin: bytes | None = None,
    timeout_s: float = 15,
) -> ExecResult:
    """``argv`` through the runtime's ``exec_in_kernel``; ``stdin`` is written and
    closed first when given.  ``TimeoutError`` when it has not ended in ``timeout_s``."""
    command = await runtime.exec_in_kernel(kernel_id, argv)
    if stdin is not None:
        await command.write(stdin)
        await command.close_stdin()
    out = {"stdout": b"", "stderr": b""}
    async with asyncio.timeout(timeout_s):
        while True:
            stream, chunk = await command.read()
            if stream is None:
                break
            out[stream] += chunk
        code = await command.wait()
    return ExecResult(
        code, out["stdout"].decode(errors="replace"), out["stderr"].decode(errors="replace")
    )
