"""Which event/stat bus to use: settings read from a TOML file and the environment.

The manager and the agents resolve the bus the same way (later steps override):

1. default: no Redis; the **in-process** bus (events travel on the agents' HTTP calls
   to the manager, stats are fetched from the agents on demand);
2. the TOML file given with ``--config`` (manager.toml or agent.toml)::

       [redis]                       # present: use Redis
       addr = "127.0.0.1:6379"       # or { host = "127.0.0.1", port = 6379 }
       db = 0
       password = ""                 # optional (AUTH); also $ACCELSHARE_REDIS_PASSWORD
       namespace = "local"           # key prefix accelshare:<namespace>:...
       timeout-s = 2.0               # connect / command timeout
       stats-interval-s = 5.0        # agents: how often stats are published
       stats-ttl-s = 30.0            # a stats snapshot older than this expires

3. environment variables: ``ACCELSHARE_REDIS_ADDR`` (selects Redis at that address),
   ``ACCELSHARE_REDIS_PASSWORD``, ``ACCELSHARE_REDIS_NAMESPACE``.

Every mistake is a :class:`~accelshare.config.ConfigFileError` naming the file or
variable, the key, what was expected and what was found.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from accelshare.config.errors import ConfigFileError
from accelshare.config.settings import parse_host_port

__all__ = [
    "ENV_REDIS_ADDR",
    "ENV_REDIS_NAMESPACE",
    "ENV_REDIS_PASSWORD",
    "BusSettings",
    "RedisSettings",
    "load_bus_settings",
]

ENV_REDIS_ADDR = "ACCELSHARE_REDIS_ADDR"
ENV_REDIS_PASSWORD = "ACCELSHARE_REDIS_PASSWORD"
ENV_REDIS_NAMESPACE = "ACCELSHARE_REDIS_NAMESPACE"


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class RedisSettings(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=_kebab, populate_by_name=True, frozen=True
    )

    addr: str = "127.0.0.1:6379"
    db: int = Field(default=0, ge=0, le=15)
    password: SecretStr | None = None
    namespace: str = Field(default="local", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    timeout_s: float = Field(default=2.0, gt=0)
    stats_interval_s: float = Field(default=5.0, gt=0)
    stats_ttl_s: float = Field(default=30.0, gt=0)
    events_maxlen: int = Field(default=100_000, ge=100)

    @field_validator("addr", mode="before")
    @classmethod
    def _addr(cls, value: Any) -> Any:
        if isinstance(value, Mapping):  # Backend.AI's { host = ..., port = ... }
            value = f"{value.get('host', '127.0.0.1')}:{value.get('port', 6379)}"
        if isinstance(value, str):
            text = value.removeprefix("redis://")
            host, port = parse_host_port(text, default_port=6379)
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return value

    @property
    def host(self) -> str:
        return parse_host_port(self.addr, default_port=6379)[0]

    @property
    def port(self) -> int:
        return parse_host_port(self.addr, default_port=6379)[1]

    def key(self, *parts: str) -> str:
        """``accelshare:<namespace>:<parts...>``."""
        return ":".join(("accelshare", self.namespace, *parts))


class BusSettings(BaseModel):
    """``redis`` None: the in-process bus."""

    model_config = ConfigDict(frozen=True)

    redis: RedisSettings | None = None
    source: str = "defaults"

    def describe(self) -> str:
        if self.redis is None:
            return "the in-process bus"
        return (
            f"Redis at {self.redis.addr} (db {self.redis.db}, namespace {self.redis.namespace!r})"
        )


def _read_table(config_file: Path) -> dict[str, Any] | None:
    from accelshare.config.settings import _read_toml  # one TOML reader for both

    raw = _read_toml(config_file)
    table = raw.get("redis")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigFileError(str(config_file), "[redis]", "a table", table)
    return table


def load_bus_settings(
    config_file: Path | None = None, *, env: Mapping[str, str] | None = None
) -> BusSettings:
    """Resolve the bus: defaults, then ``config_file``'s ``[redis]``, then ``env``."""
    env = os.environ if env is None else env
    source = "defaults"
    table: dict[str, Any] | None = None
    if config_file is not None:
        table = _read_table(config_file)
        if table is not None:
            source = str(config_file)
    updates: dict[str, Any] = {}
    if addr := env.get(ENV_REDIS_ADDR):
        updates["addr"] = addr
        source = f"{source} + ${ENV_REDIS_ADDR}"
    if password := env.get(ENV_REDIS_PASSWORD):
        updates["password"] = password
    if namespace := env.get(ENV_REDIS_NAMESPACE):
        updates["namespace"] = namespace
    if table is None and "addr" not in updates:
        return BusSettings(source=source)
    data = {**(table or {}), **updates}
    try:
        redis = RedisSettings.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(table)"
        where = source if key not in updates else "environment"
        raise ConfigFileError(where, f"[redis] {key}", first["msg"], first.get("input")) from e
    return BusSettings(redis=redis, source=source)
