"""Publishing a sandboxed ``process`` kernel's app ports.

A sandboxed kernel has a network namespace of its own: each published port
(``KernelSpec.published_ports``, kept in its ``launch.json``) is relayed from the
agent's ``publish_host`` into that namespace (:mod:`.netns_forward`).  Relays live in
the agent's memory only; a new agent relays its re-adopted kernels' ports again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..scratch import read_json
from .netns_forward import NetnsForwarder
from .process_state import KernelStates
from .procfs import is_same_process

__all__ = ["PortRelays"]

log = logging.getLogger(__name__)


class PortRelays:
    """The running sandboxed kernels' port relays, one :class:`NetnsForwarder` each."""

    def __init__(
        self,
        states: KernelStates,
        *,
        proc_root: Path,
        publish_host: str,
        exec_helper: Path | None = None,
    ) -> None:
        self._states = states
        self._proc_root = proc_root
        self._publish_host = publish_host
        # (makes the relays' sockets where the agent is not root: netns_forward.py)
        self._exec_helper = None if exec_helper is None else str(exec_helper)
        self._forwarders: dict[str, NetnsForwarder] = {}

    async def forward(self, kernel_id: str) -> None:
        """Relay a running sandboxed kernel's published ports (its ``launch.json``) into
        its network namespace, unless already relayed."""
        if kernel_id in self._forwarders:
            return
        scratch = self._states.scratch(kernel_id)
        launch = read_json(scratch.launch_file) or {}
        ports = [tuple(p) for p in launch.get("published_ports") or ()]
        proc = read_json(scratch.proc_file) or {}
        pid, start = proc.get("sandbox_pid"), proc.get("sandbox_start")
        if not ports or not isinstance(pid, int):
            return
        if not is_same_process(
            pid, start if isinstance(start, int) else None, proc_root=self._proc_root
        ):
            raise OSError(f"the sandbox of kernel {kernel_id} (pid {pid}) is gone")
        forwarder = await NetnsForwarder.start(
            netns_path=str(self._proc_root / str(pid) / "ns" / "net"),
            listen_host=self._publish_host,
            ports=[(int(c), int(h)) for c, h in ports],
            exec_helper=self._exec_helper,
        )
        if kernel_id in self._forwarders:  # started meanwhile by another caller
            await forwarder.close()
            return
        self._forwarders[kernel_id] = forwarder
        log.info(
            "kernel %s: app ports relayed %s",
            kernel_id,
            ", ".join(f"{self._publish_host}:{h} -> {c}" for c, h in forwarder.ports),
        )

    async def stop(self, kernel_id: str) -> None:
        """Stop relaying the kernel's ports (nothing if none are relayed)."""
        forwarder = self._forwarders.pop(kernel_id, None)
        if forwarder is not None:
            await forwarder.close()

    async def close(self) -> None:
        """Stop every relay (the kernels keep running)."""
        for kernel_id in list(self._forwarders):
            await self.stop(kernel_id)
