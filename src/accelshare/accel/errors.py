"""Errors raised while loading and configuring compute plugins.

Hierarchy::

    Exception
     └── PluginError                 base of this module
          ├── PluginConfigError      a bad value in a plugin's configuration (TOML file or
          │                          config store): names the source, key, expected and
          │                          received value
          │    └── UnknownOptionError   an option name the plugin does not know (a typo
          │                             such as 'alocation_mode'): names the source, the
          │                             key and the known option names
          ├── PluginUnavailable      the plugin cannot run on this machine (no NVML library,
          │                          no driver, no mock-accelerator.toml); fatal when the plugin
          │                          was explicitly allowed, a logged skip otherwise
          └── PluginLoadError        the set of plugins is inconsistent (duplicate keys, a slot
                                     outside the plugin's prefix, an unknown plugin name in the
                                     allow list, an intrinsic plugin blocked)

Every one of them stops the agent: no plugin is ever disabled silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

__all__ = [
    "PluginConfigError",
    "PluginError",
    "PluginLoadError",
    "PluginUnavailable",
    "UnknownOptionError",
]

_MISSING_TEXT = "nothing (the key is missing)"


class _Missing:
    """Marker for "the key is not there" in :class:`PluginConfigError`."""

    def __repr__(self) -> str:
        return _MISSING_TEXT


MISSING: Any = _Missing()


class PluginError(Exception):
    """Base class of every compute-plugin error."""


class PluginConfigError(PluginError):
    """A configuration value is wrong.

    ``str(err)`` reads ``<source>: key '<key>': expected <expected>, received <received>``,
    for example::

        configs/accelerator/mock-accelerator.toml: key 'devices[1].memory_size':
        expected a positive binary size such as '40G', received '-1G'
    """

    def __init__(self, source: str, key: str, expected: str, received: Any) -> None:
        self.source = source
        self.key = key
        self.expected = expected
        self.received = received
        shown = _MISSING_TEXT if received is MISSING else repr(received)
        super().__init__(f"{source}: key {key!r}: expected {expected}, received {shown}")


class UnknownOptionError(PluginConfigError):
    """An option name nobody reads: refused so that a typo does not silently do nothing.

    ``str(err)`` reads, for example::

        config store config/plugins/accelerator/cuda/ (global scope): key 'alocation_mode':
        unknown option (set to 'fractional'); did you mean 'allocation_mode'? known options:
        allocation_mode, unit_mem, unit_proc, quantum_size, device_mask, reserved_memory
    """

    def __init__(self, source: str, key: str, known: Sequence[str], received: Any) -> None:
        self.known = tuple(known)
        close = difflib.get_close_matches(key, self.known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        expected = f"one of the known options {', '.join(self.known)}"
        PluginError.__init__(
            self,
            f"{source}: key {key!r}: unknown option (set to {received!r}); {hint}"
            f"known options: {', '.join(self.known)}",
        )
        self.source = source
        self.key = key
        self.expected = expected
        self.received = received


class PluginUnavailable(PluginError):
    """The plugin has nothing to work with on this machine (e.g. no NVML library)."""


class PluginLoadError(PluginError):
    """The plugin set cannot be assembled; the message says which plugin and why."""
