"""Errors raised while loading and configuring compute plugins.

Hierarchy::

    Exception
     └── PluginError                 base of this module
          ├── PluginConfigError      a bad value in a plugin's configuration (TOML file or
          │                          config store): names the source, key, expected and
          │                          received value
          ├── PluginUnavailable      the plugin cannot run on this machine (no NVML library,
          │                          no driver, no mock-accelerator.toml); fatal when the plugin
          │                          was explicitly allowed, a logged skip otherwise
          └── PluginLoadError        the set of plugins is inconsistent (duplicate keys, a slot
                                     outside the plugin's prefix, an unknown plugin name in the
                                     allow list, an intrinsic plugin blocked)

Every one of them stops the agent: no plugin is ever disabled silently.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PluginConfigError", "PluginError", "PluginLoadError", "PluginUnavailable"]

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


class PluginUnavailable(PluginError):
    """The plugin has nothing to work with on this machine (e.g. no NVML library)."""


class PluginLoadError(PluginError):
    """The plugin set cannot be assembled; the message says which plugin and why."""
