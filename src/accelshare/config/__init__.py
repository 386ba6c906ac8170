"""The cluster-wide configuration tree (spec 06): one async interface, etcd and embedded backends.

    settings = load_config_store_settings(Path("agent.toml"))   # or None: env + defaults
    async with await open_config_store(settings) as store:
        mode = await store.get("config/plugins/accelerator/cuda/allocation_mode")

See docs/config-store.md for the layout, scopes, CLI and backup/restore.
"""

from .errors import (
    ConfigFileError,
    ConfigStoreError,
    ConfigStoreNotFound,
    ConfigStoreUnavailable,
    InvalidConfigInput,
    InvalidKey,
    InvalidTree,
    LeaseNotFound,
    LockTimeout,
    ScopeNotConfigured,
    TransactionRejected,
)
from .factory import build_backend, open_config_store
from .settings import (
    ConfigStoreSettings,
    EmbeddedSettings,
    EtcdSettings,
    config_store_env,
    load_config_store_settings,
)
from .store import ConfigStore, make_scope_prefix_map
from .types import ConfigScopes, NestedDict, WatchEvent, WatchEventType

__all__ = [
    "ConfigFileError",
    "ConfigScopes",
    "ConfigStore",
    "ConfigStoreError",
    "ConfigStoreNotFound",
    "ConfigStoreSettings",
    "ConfigStoreUnavailable",
    "EmbeddedSettings",
    "EtcdSettings",
    "InvalidConfigInput",
    "InvalidKey",
    "InvalidTree",
    "LeaseNotFound",
    "LockTimeout",
    "NestedDict",
    "ScopeNotConfigured",
    "TransactionRejected",
    "WatchEvent",
    "WatchEventType",
    "build_backend",
    "config_store_env",
    "load_config_store_settings",
    "make_scope_prefix_map",
    "open_config_store",
]
