"""Finding and loading compute plugins (entry-point group ``accelshare.compute_plugins``).

Selection (pure, :func:`select_plugins`)::

    allowed = None          every installed plugin; one that finds nothing to drive
                            (PluginUnavailable: no NVML, no mock-accelerator.toml) is
                            skipped and reported in LoadedPlugins.skipped
    allowed = ["mock"]      cpu, mem and mock; if mock cannot run the agent stops
    blocked = ["cuda"]      removed after the allow list is applied

Entries are entry-point names (``mock``), module paths (``accelshare.accel.mock``),
``module:attr`` values, or Backend.AI module paths (``ai.backend.accelerator.mock`` ->
mock, ``ai.backend.accelerator.cuda_open`` / ``ai.backend.accelerator.cuda`` -> cuda) so
that an existing Backend.AI ``agent.toml`` works unchanged.  ``cpu`` and ``mem`` are
always loaded.  Loading (:func:`load_compute_plugins`) then refuses two plugins with the
same key and any slot outside its plugin's ``<key>.`` prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import cast

from .errors import PluginError, PluginLoadError, PluginUnavailable
from .protocol import ComputePlugin, PluginContext, PluginFactory, validate_inventory

__all__ = [
    "BACKEND_AI_ALIASES",
    "ENTRY_POINT_GROUP",
    "INTRINSIC_PLUGINS",
    "LoadedPlugins",
    "PluginEntry",
    "PluginSelection",
    "installed_plugin_entries",
    "load_compute_plugins",
    "select_plugins",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "accelshare.compute_plugins"
INTRINSIC_PLUGINS = ("cpu", "mem")
BACKEND_AI_ALIASES = {
    "ai.backend.accelerator.mock": "mock",
    "ai.backend.accelerator.cuda_open": "cuda",
    "ai.backend.accelerator.cuda": "cuda",
}
_BUILTIN_VALUES = {
    "cpu": "accelshare.accel.cpu:create_plugin",
    "mem": "accelshare.accel.mem:create_plugin",
}


@dataclass(frozen=True, slots=True)
class PluginEntry:
    """One installed plugin: its entry-point name, where it lives, how to load it."""

    name: str
    value: str  # "package.module:attr"
    load: Callable[[], PluginFactory] = field(compare=False)

    @property
    def module(self) -> str:
        return self.value.partition(":")[0]

    @classmethod
    def from_value(cls, name: str, value: str) -> PluginEntry:
        def load() -> PluginFactory:
            module_name, _, attr = value.partition(":")
            obj: object = import_module(module_name)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
            return cast(PluginFactory, obj)

        return cls(name, value, load)

    @classmethod
    def from_entry_point(cls, ep: EntryPoint) -> PluginEntry:
        return cls(ep.name, ep.value, lambda: cast(PluginFactory, ep.load()))


def installed_plugin_entries(group: str = ENTRY_POINT_GROUP) -> list[PluginEntry]:
    """Installed plugins by entry point; cpu and mem are always among them."""
    found: dict[str, PluginEntry] = {}
    for ep in entry_points(group=group):
        previous = found.get(ep.name)
        if previous is not None and previous.value != ep.value:
            raise PluginLoadError(
                f"two installed packages register the compute plugin {ep.name!r} "
                f"({previous.value} and {ep.value}); uninstall one of them"
            )
        found[ep.name] = PluginEntry.from_entry_point(ep)
    for name, value in _BUILTIN_VALUES.items():
        found.setdefault(name, PluginEntry.from_value(name, value))
    return sorted(found.values(), key=lambda e: e.name)


@dataclass(frozen=True, slots=True)
class PluginSelection:
    entry: PluginEntry
    explicit: bool  # named in the allow list (or intrinsic): failing to load is fatal


def _resolve(item: str, entries: Sequence[PluginEntry]) -> PluginEntry | None:
    name = BACKEND_AI_ALIASES.get(item, item)
    for entry in entries:
        if name in (entry.name, entry.value, entry.module):
            return entry
    return None


def select_plugins(
    entries: Sequence[PluginEntry],
    allowed: Iterable[str] | None,
    blocked: Iterable[str] = (),
) -> list[PluginSelection]:
    """Which plugins to load, cpu and mem first (see the module docstring)."""
    installed = ", ".join(e.name for e in entries)
    blocked_names: set[str] = set()
    for item in blocked:
        entry = _resolve(item, entries)
        if entry is None:
            log.warning("blocked-compute-plugins names %r, which is not installed", item)
            continue
        if entry.name in INTRINSIC_PLUGINS:
            raise PluginLoadError(
                f"blocked-compute-plugins names {item!r}: cpu and mem are intrinsic and "
                "always loaded"
            )
        blocked_names.add(entry.name)
    chosen: list[PluginSelection] = []
    for name in INTRINSIC_PLUGINS:
        entry = _resolve(name, entries)
        if entry is None:
            raise PluginLoadError(f"the intrinsic compute plugin {name!r} is not installed")
        chosen.append(PluginSelection(entry, explicit=True))
    if allowed is None:
        rest = [PluginSelection(e, explicit=False) for e in entries]
    else:
        rest = []
        for item in allowed:
            entry = _resolve(item, entries)
            if entry is None:
                raise PluginLoadError(
                    f"allowed-compute-plugins names {item!r}, but no such compute plugin is "
                    f"installed (installed: {installed}; entry-point group {ENTRY_POINT_GROUP!r})"
                )
            rest.append(PluginSelection(entry, explicit=True))
    seen = set(INTRINSIC_PLUGINS)
    for selection in rest:
        name = selection.entry.name
        if name in seen or name in blocked_names:
            continue
        seen.add(name)
        chosen.append(selection)
    return chosen


@dataclass
class LoadedPlugins:
    """The agent's plugins by key, in load order (cpu, mem, then the accelerators)."""

    plugins: dict[str, ComputePlugin] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # key -> entry-point name
    skipped: dict[str, str] = field(default_factory=dict)  # entry-point name -> why

    async def close(self) -> None:
        for plugin in reversed(list(self.plugins.values())):
            try:
                await plugin.close()
            except Exception:  # closing must not hide the others or the original error
                log.exception("closing compute plugin %r failed", plugin.inventory.key)


async def _create(selection: PluginSelection, ctx: PluginContext) -> ComputePlugin | str:
    """The plugin, or why it was skipped (only for plugins not named explicitly)."""
    name = selection.entry.name
    try:
        factory = selection.entry.load()
        plugin = await factory(ctx)
    except PluginUnavailable as e:
        if selection.explicit:
            raise PluginLoadError(
                f"compute plugin {name!r} is enabled in agent.toml but cannot run: {e}"
            ) from e
        log.warning("compute plugin %r skipped: %s", name, e)
        return str(e)
    except PluginError:
        raise
    except ImportError as e:
        raise PluginLoadError(
            f"compute plugin {name!r} ({selection.entry.value}) cannot be imported: {e}"
        ) from e
    if not isinstance(plugin, ComputePlugin):
        raise PluginLoadError(
            f"compute plugin {name!r} ({selection.entry.value}) returned "
            f"{type(plugin).__name__}, which does not implement the ComputePlugin protocol"
        )
    return plugin


async def load_compute_plugins(
    ctx: PluginContext, *, entries: Sequence[PluginEntry] | None = None
) -> LoadedPlugins:
    """Load the plugins the agent config allows, exactly as the agent does at start.

    Raises :class:`PluginError` (config errors, unavailable explicit plugins, duplicate
    keys, slots outside a prefix); plugins created before the failure are closed.
    """
    agent = ctx.agent_config.agent
    selections = select_plugins(
        installed_plugin_entries() if entries is None else entries,
        agent.allowed_compute_plugins,
        agent.blocked_compute_plugins,
    )
    loaded = LoadedPlugins()
    try:
        for selection in selections:
            name = selection.entry.name
            plugin = await _create(selection, ctx)
            if isinstance(plugin, str):
                loaded.skipped[name] = plugin
                continue
            inventory = plugin.inventory
            try:
                validate_inventory(inventory)
            except PluginLoadError:
                await plugin.close()
                raise
            if inventory.key in loaded.plugins:
                await plugin.close()
                raise PluginLoadError(
                    f"compute plugins {loaded.origins[inventory.key]!r} and {name!r} both "
                    f"declare the key {inventory.key!r}; enable only one of them "
                    "(allowed-compute-plugins / blocked-compute-plugins in agent.toml)"
                )
            loaded.plugins[inventory.key] = plugin
            loaded.origins[inventory.key] = name
    except BaseException:
        await loaded.close()
        raise
    return loaded
