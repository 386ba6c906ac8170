"""Errors of the configuration store.

Hierarchy::

    Exception
     └── ConfigStoreError                 base: anything the store cannot do
          ├── ConfigStoreUnavailable      the backend cannot be reached within the timeout
          ├── ConfigStoreNotFound         the embedded store's file does not exist (not created)
          ├── LockTimeout                 a lock was not acquired within ``timeout_s``
          ├── LeaseNotFound               refreshing a lease that expired or was revoked
          ├── TransactionRejected         the backend refused a transaction; nothing was written
          └── InvalidConfigInput          (also a ValueError) bad input from the caller
               ├── InvalidKey             an empty key path, an empty path component, ...
               ├── InvalidTree            a value put_prefix cannot store (null, list, ...)
               └── ScopeNotConfigured     a scope without a prefix (no scaling group / node id given)
    ValueError
     ├── ConfigFileError                  a settings file or environment variable is wrong
     └── ConfigKeyError                   a key of a daemon's TOML file (agent.toml,
                                          storage.toml) is missing or wrong

Messages name what was expected and what was received, so that an operator can fix
the command line or the file from the message alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "MISSING",
    "ConfigFileError",
    "ConfigKeyError",
    "ConfigStoreError",
    "ConfigStoreNotFound",
    "ConfigStoreUnavailable",
    "InvalidConfigInput",
    "InvalidKey",
    "InvalidTree",
    "LeaseNotFound",
    "LockTimeout",
    "ScopeNotConfigured",
    "TransactionRejected",
]


class ConfigStoreError(Exception):
    """Base of every error raised by ``accelshare.config``'s stores."""


class ConfigStoreUnavailable(ConfigStoreError):
    """The backend did not answer within the configured timeout (etcd down, DB locked)."""


class ConfigStoreNotFound(ConfigStoreError):
    """The embedded store's file does not exist, and the store was opened without
    ``create`` (``accelshare mgr etcd`` without ``--create``)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"no configuration store at {path}")
        self.path = path


class LockTimeout(ConfigStoreError):
    def __init__(self, name: str, timeout_s: float) -> None:
        super().__init__(f"could not acquire the lock {name!r} within {timeout_s:g} s")
        self.name = name
        self.timeout_s = timeout_s


class LeaseNotFound(ConfigStoreError):
    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id} does not exist (expired or revoked)")
        self.lease_id = lease_id


class TransactionRejected(ConfigStoreError):
    """The whole transaction was refused; none of its writes were applied."""


class InvalidConfigInput(ConfigStoreError, ValueError):
    """Bad input from the caller; carries what was expected and what was received."""

    def __init__(self, message: str, *, expected: str = "", received: Any = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received


class InvalidKey(InvalidConfigInput):
    pass


class InvalidTree(InvalidConfigInput):
    pass


class ScopeNotConfigured(InvalidConfigInput):
    pass


class ConfigFileError(ValueError):
    """A settings file (TOML) or environment variable has a wrong or missing value."""

    def __init__(self, source: str, key: str, expected: str, received: Any) -> None:
        super().__init__(f"{source}: {key}: expected {expected}, got {received!r}")
        self.source = source
        self.key = key
        self.expected = expected
        self.received = received


MISSING: Any = object()
"""``received`` of a :class:`ConfigKeyError` whose key is absent."""


class ConfigKeyError(ValueError):
    """A key of a daemon's TOML file: names the file, the key, the expected and the
    received value (:data:`MISSING`: the key is absent)."""

    def __init__(self, source: str, key: str, expected: str, received: Any = MISSING) -> None:
        self.source = source
        self.key = key
        self.expected = expected
        self.received = received
        shown = "nothing (the key is missing)" if received is MISSING else repr(received)
        super().__init__(f"{source}: key {key!r}: expected {expected}, received {shown}")
