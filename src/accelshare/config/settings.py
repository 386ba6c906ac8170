"""Which configuration store to open: settings, read from a TOML file and the environment.

The daemons and ``accelshare mgr etcd`` resolve the store the same way, later steps
overriding earlier ones:

1. default: the embedded store at ``./.accelshare/config-store.db``, namespace ``local``;
2. the TOML file given with ``--config`` (e.g. agent.toml or manager.toml)::

       [etcd]                      # present: use etcd
       addr = "127.0.0.1:2379"     # or { host = "127.0.0.1", port = 2379 }
       namespace = "local"
       user = ""                   # optional, with password
       password = ""
       # timeout-s = 5.0           # give up on an unreachable etcd after this long

       [config-store]              # optional
       backend = "embedded"        # default: "etcd" if there is an [etcd] table, else "embedded"
       path = "./.accelshare/config-store.db"   # relative to the working directory
       namespace = "local"         # (embedded; etcd takes [etcd].namespace)

   Without a ``[config-store] path``, a manager.toml's ``[manager] data-dir`` puts the
   embedded store at ``<data-dir>/config-store.db``, where the manager keeps it.
   ``[agent] id`` and ``[agent] scaling-group``, if present, become the node and
   scaling-group scopes;
3. environment variables: ``ACCELSHARE_ETCD_ADDR`` (selects etcd at that address),
   ``ACCELSHARE_CONFIG_STORE`` (selects the embedded store at that path; setting both
   is an error), ``ACCELSHARE_CONFIG_NAMESPACE``, ``ACCELSHARE_ETCD_USER``,
   ``ACCELSHARE_ETCD_PASSWORD``.

Every mistake is a ``ConfigFileError`` naming the file or variable, the key, what was
expected and what was found.  ``ConfigStoreSettings.location_source`` says which step
chose the store's location (for ``accelshare mgr etcd --verbose`` and its errors), and
:func:`config_store_env` gives the variables that select a store (a local cluster's
``client.env``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from .errors import ConfigFileError

__all__ = [
    "DEFAULT_EMBEDDED_PATH",
    "ENV_CONFIG_NAMESPACE",
    "ENV_CONFIG_STORE",
    "ENV_ETCD_ADDR",
    "ENV_ETCD_PASSWORD",
    "ENV_ETCD_USER",
    "ConfigStoreSettings",
    "EmbeddedSettings",
    "EtcdSettings",
    "config_store_env",
    "load_config_store_settings",
    "parse_host_port",
]

DEFAULT_EMBEDDED_PATH = Path(".accelshare/config-store.db")
ENV_ETCD_ADDR = "ACCELSHARE_ETCD_ADDR"
ENV_ETCD_USER = "ACCELSHARE_ETCD_USER"
ENV_ETCD_PASSWORD = "ACCELSHARE_ETCD_PASSWORD"
ENV_CONFIG_STORE = "ACCELSHARE_CONFIG_STORE"
ENV_CONFIG_NAMESPACE = "ACCELSHARE_CONFIG_NAMESPACE"
M = TypeVar("M", bound=BaseModel)


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def parse_host_port(addr: str, *, default_port: int = 2379) -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:2379"`` or ``"host"`` -> (host, port)."""
    text = addr.strip()
    if text.startswith("http://"):
        text = text.removeprefix("http://")
    host, sep, port_text = text.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = text, str(default_port)
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"expected 'host:port', got {addr!r}")
    return host, int(port_text)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=_kebab, populate_by_name=True, frozen=True
    )


class EtcdSettings(_Model):
    addr: str = "127.0.0.1:2379"
    namespace: str = "local"
    user: str | None = None
    password: SecretStr | None = None
    timeout_s: float = Field(default=5.0, gt=0)
    reconnect_timeout_s: float | None = Field(default=60.0, gt=0)

    @field_validator("addr", mode="before")
    @classmethod
    def _addr(cls, value: Any) -> Any:
        if isinstance(value, Mapping):  # Backend.AI's { host = ..., port = ... }
            value = f"{value.get('host', '127.0.0.1')}:{value.get('port', 2379)}"
        if isinstance(value, str):
            host, port = parse_host_port(value)
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return value

    @property
    def host(self) -> str:
        return parse_host_port(self.addr)[0]

    @property
    def port(self) -> int:
        return parse_host_port(self.addr)[1]


class EmbeddedSettings(_Model):
    path: Path = DEFAULT_EMBEDDED_PATH
    namespace: str = "local"
    timeout_s: float = Field(default=5.0, gt=0)
    poll_interval_s: float = Field(default=0.05, gt=0)


class _ConfigStoreTable(_Model):
    """The ``[config-store]`` table."""

    backend: Literal["embedded", "etcd"] | None = None
    path: Path | None = None
    namespace: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    poll_interval_s: float | None = Field(default=None, gt=0)
    key_prefix: str | None = None


class ConfigStoreSettings(_Model):
    backend: Literal["embedded", "etcd"] = "embedded"
    etcd: EtcdSettings = EtcdSettings()
    embedded: EmbeddedSettings = EmbeddedSettings()
    key_prefix: str = "accelshare"
    scaling_group: str | None = (
        None  # default scaling-group scope (agent.toml [agent] scaling-group)
    )
    node_id: str | None = None  # default node scope (agent.toml [agent] id)
    source: str = "defaults"  # where the settings came from, for messages
    # which step chose the location (the embedded file or the etcd address), for messages:
    # "the default", "FILE [config-store] path", "$ACCELSHARE_CONFIG_STORE", ...
    location_source: str = "the default"

    @property
    def namespace(self) -> str:
        return self.etcd.namespace if self.backend == "etcd" else self.embedded.namespace

    def describe(self) -> str:
        if self.backend == "etcd":
            return f"etcd at {self.etcd.addr}, namespace {self.namespace!r}"
        return f"the embedded store at {self.embedded.path}, namespace {self.namespace!r}"


def load_config_store_settings(
    config_file: Path | None = None, *, env: Mapping[str, str] | None = None
) -> ConfigStoreSettings:
    """Resolve the store settings: defaults, then ``config_file``, then ``env``."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    source = "defaults"
    if config_file is not None:
        raw = _read_toml(config_file)
        source = str(config_file)

    etcd_raw = _table(raw, "etcd", source)
    store_raw = _table(raw, "config-store", source)
    agent_raw = _table(raw, "agent", source)
    etcd = _validate(EtcdSettings, etcd_raw, source, "[etcd]")
    table = _validate(_ConfigStoreTable, store_raw, source, "[config-store]")
    backend = table.backend or ("etcd" if "etcd" in raw else "embedded")
    embedded_fields = {
        name: value
        for name, value in {
            "path": table.path,
            "namespace": table.namespace,
            "timeout_s": table.timeout_s,
            "poll_interval_s": table.poll_interval_s,
        }.items()
        if value is not None
    }
    location_source = "the default"
    if backend == "etcd":
        location_source = f"{source} [etcd] addr"
    elif table.path is not None:
        location_source = f"{source} [config-store] path"
    else:
        data_dir = _table(raw, "manager", source).get("data-dir")
        if data_dir is not None:
            if not isinstance(data_dir, str) or not data_dir:
                raise ConfigFileError(source, "[manager] data-dir", "a folder", data_dir)
            embedded_fields["path"] = Path(data_dir) / "config-store.db"
            location_source = f"{source} [manager] data-dir"
    embedded = EmbeddedSettings(**embedded_fields)

    etcd_addr = env.get(ENV_ETCD_ADDR)
    store_path = env.get(ENV_CONFIG_STORE)
    if etcd_addr and store_path:
        raise ConfigFileError(
            "environment",
            f"{ENV_ETCD_ADDR} / {ENV_CONFIG_STORE}",
            "at most one of them (etcd or the embedded store)",
            f"{etcd_addr} and {store_path}",
        )
    etcd_updates: dict[str, Any] = {}
    if etcd_addr:
        backend = "etcd"
        source = f"{source} + ${ENV_ETCD_ADDR}"
        location_source = f"${ENV_ETCD_ADDR}"
        etcd_updates["addr"] = etcd_addr
    if store_path:
        backend = "embedded"
        source = f"{source} + ${ENV_CONFIG_STORE}"
        location_source = f"${ENV_CONFIG_STORE}"
        embedded = embedded.model_copy(update={"path": Path(store_path)})
    if user := env.get(ENV_ETCD_USER):
        etcd_updates["user"] = user
    if password := env.get(ENV_ETCD_PASSWORD):
        etcd_updates["password"] = password
    if namespace := env.get(ENV_CONFIG_NAMESPACE):
        etcd_updates["namespace"] = namespace
        embedded = embedded.model_copy(update={"namespace": namespace})
    if etcd_updates:
        merged = {**etcd.model_dump(exclude_unset=True), **etcd_updates}
        if isinstance(merged.get("password"), SecretStr):
            merged["password"] = merged["password"].get_secret_value()
        etcd = _validate(EtcdSettings, merged, "environment", "etcd")
    if backend == "etcd" and "etcd" not in raw and not etcd_addr:
        raise ConfigFileError(
            source, "[config-store] backend", f"an [etcd] table or ${ENV_ETCD_ADDR}", "etcd"
        )

    node_id = agent_raw.get("id")
    scaling_group = agent_raw.get("scaling-group")
    return ConfigStoreSettings(
        backend=backend,
        etcd=etcd,
        embedded=embedded,
        key_prefix=table.key_prefix or "accelshare",
        node_id=node_id if isinstance(node_id, str) and node_id else None,
        scaling_group=scaling_group if isinstance(scaling_group, str) and scaling_group else None,
        source=source,
        location_source=location_source,
    )


def config_store_env(settings: ConfigStoreSettings) -> dict[str, str]:
    """The environment variables that select the store of ``settings`` over any other
    setting (step 3 above): its embedded file (made absolute) or its etcd address, the
    other selector emptied (both set is an error), and its namespace.  etcd credentials
    are not included: give them with ``ACCELSHARE_ETCD_USER`` / ``_PASSWORD``."""
    if settings.backend == "etcd":
        selected = {ENV_ETCD_ADDR: settings.etcd.addr, ENV_CONFIG_STORE: ""}
    else:
        path = Path(os.path.abspath(settings.embedded.path))
        selected = {ENV_CONFIG_STORE: str(path), ENV_ETCD_ADDR: ""}
    return {**selected, ENV_CONFIG_NAMESPACE: settings.namespace}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigFileError(str(path), "(file)", "a readable TOML file", e.strerror) from e
    try:
        return tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigFileError(str(path), "(syntax)", "valid TOML", str(e)) from e


def _table(raw: Mapping[str, Any], name: str, source: str) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise ConfigFileError(source, f"[{name}]", "a table", value)
    return value


def _validate(model: type[M], data: Mapping[str, Any], source: str, table: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(table)"
        raise ConfigFileError(source, f"{table} {key}", first["msg"], first.get("input")) from e
