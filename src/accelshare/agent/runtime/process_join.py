"""Joining a running ``process`` kernel: terminals and commands.

A terminal (:mod:`.terminal`) or a command of the execute API (:mod:`.execs`) runs with
the kernel's ``launch.json``: its environment, cwd and limits; in a sandboxed kernel it
enters the namespaces of the sandbox's init as the kernel's user.  Each has its own
session and process group, so without cgroups a kernel's signals would not reach it:
the runtime ends them with the kernel (:meth:`KernelJoins.end`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..scratch import read_json
from .base import KernelState
from .environments import ProcessEnvironment
from .errors import KernelNotFound
from .execs import PipeExec
from .process_state import KernelStates
from .procfs import is_same_process
from .terminal import ProcessTerminal, pick_shell

__all__ = ["KernelJoins"]


class KernelJoins:
    """The terminals and commands open in running kernels."""

    def __init__(
        self,
        states: KernelStates,
        *,
        environments: Mapping[str, ProcessEnvironment],
        proc_root: Path,
    ) -> None:
        self._states = states
        self._environments = environments
        self._proc_root = proc_root
        self._terminals: dict[str, set[ProcessTerminal]] = {}
        self._execs: dict[str, set[PipeExec]] = {}

    async def end(self, kernel_id: str) -> None:
        """Close the kernel's terminals and kill its commands."""
        for terminal in list(self._terminals.pop(kernel_id, ())):
            await terminal.close()
        for command in list(self._execs.pop(kernel_id, ())):
            await command.kill()

    async def _exec_target(self, kernel_id: str) -> tuple[Path, int | None]:
        """Where a terminal or a command joins a running kernel: its ``launch.json``
        and its sandbox's init (None: not sandboxed); ``KernelNotFound`` unless the
        kernel is running."""
        info = await self._states.get(kernel_id)
        scratch = self._states.scratch(kernel_id)
        if info.state is not KernelState.RUNNING or not scratch.launch_file.exists():
            raise KernelNotFound(kernel_id)
        launch = read_json(scratch.launch_file) or {}
        if not launch.get("sandbox"):
            return scratch.launch_file, None
        # the sandbox's init: what joins it enters its namespaces, as the kernel's user
        proc = read_json(scratch.proc_file) or {}
        pid, start = proc.get("sandbox_pid"), proc.get("sandbox_start")
        if not isinstance(pid, int) or not is_same_process(
            pid, start if isinstance(start, int) else None, proc_root=self._proc_root
        ):
            raise KernelNotFound(kernel_id)
        return scratch.launch_file, pid

    async def open_terminal(self, kernel_id: str, *, cols: int, rows: int) -> ProcessTerminal:
        """A shell on a pty with the kernel's environment, cwd and limits (see
        :mod:`.terminal`); ``KernelNotFound`` unless the kernel is running."""
        launch_file, namespace_pid = await self._exec_target(kernel_id)
        terminal = await asyncio.to_thread(
            ProcessTerminal.spawn,
            launch_file,
            cols=cols,
            rows=rows,
            shell=pick_shell(),
            namespace_pid=namespace_pid,
        )
        open_ = self._terminals.setdefault(kernel_id, set())
        open_.add(terminal)
        terminal.on_close = open_.discard
        return terminal

    async def exec_in_kernel(self, kernel_id: str, argv: Sequence[str]) -> PipeExec:
        """``argv`` on pipes with the kernel's environment, cwd and limits, in its
        sandbox as its user (see :mod:`.execs`); ``KernelNotFound`` unless it runs."""
        launch_file, namespace_pid = await self._exec_target(kernel_id)
        command = await PipeExec.spawn(launch_file, argv, namespace_pid=namespace_pid)
        running = self._execs.setdefault(kernel_id, set())
        running.add(command)
        command.on_end = running.discard
        return command

    def interpreter_argv(self, kernel_id: str, code: str) -> list[str]:
        """Run ``code`` with the kernel's environment's interpreter: its command prefix
        and the code (``python -c CODE``; ``sh -c CODE`` for a prefix that ends with
        ``-c`` already)."""
        launch = read_json(self._states.scratch(kernel_id).launch_file) or {}
        environment = self._environments.get(str(launch.get("image", "")))
        prefix = list(environment.command_prefix) if environment else [sys.executable]
        return [*prefix, code] if prefix[-1] == "-c" else [*prefix, "-c", code]
