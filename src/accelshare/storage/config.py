"""``storage.toml``: the storage proxy's settings (docs/storage.md).

::

    [storage-proxy]
    node-id = "local"                        # the proxy's name (Backend.AI's proxy name)
    secret = "..."                           # the manager sends it on every request
    manager-api = "127.0.0.1:6021"           # HOST:PORT of the manager-facing API
    client-api = "0.0.0.0:6022"              # HOST:PORT of the client-facing API
    client-url = "http://storage.example:6022"   # what clients are told (TransferTicket.url)
    token-ttl = 1800                         # seconds a transfer token is valid
    cors-origins = ["https://console.example"]   # web origins allowed to upload/download

    [volume.volume1]
    backend = "vfs"
    path = "/srv/accelshare/volume1"

A bad value is a :class:`StorageConfigError` naming the file, the key, what was
expected and what was received.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from accelshare.config.errors import MISSING, ConfigKeyError

__all__ = [
    "DEFAULT_TOKEN_TTL_S",
    "ProxySection",
    "StorageConfig",
    "StorageConfigError",
    "VolumeSection",
    "load_storage_config",
    "parse_storage_config",
]

DEFAULT_TOKEN_TTL_S = 1800
MIN_SECRET_LENGTH = 16
_MISSING = MISSING
_VOLUME_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ORIGIN = re.compile(r"^https?://[^/\s?#@]+$")


class StorageConfigError(ConfigKeyError):
    """A bad ``storage.toml``: names the file, key, expected and received value."""


def _host_port(value: Any) -> str:
    expected = "'HOST:PORT' with a port in 1..65535, such as '127.0.0.1:6021'"
    if not isinstance(value, str):
        raise ValueError(expected)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(expected)
    return value


HostPort = Annotated[str, BeforeValidator(_host_port)]


class _Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True, strict=True)


class ProxySection(_Section):
    node_id: str = Field(alias="node-id", pattern=_VOLUME_NAME)
    secret: str = Field(min_length=MIN_SECRET_LENGTH, repr=False)
    manager_api: HostPort = Field(default="127.0.0.1:6021", alias="manager-api")
    client_api: HostPort = Field(default="127.0.0.1:6022", alias="client-api")
    client_url: str | None = Field(default=None, alias="client-url")
    token_ttl: int = Field(default=DEFAULT_TOKEN_TTL_S, alias="token-ttl", ge=10, le=7 * 86400)
    cors_origins: tuple[str, ...] = Field(default=(), alias="cors-origins")

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> tuple[str, ...]:
        expected = (
            "a list of web origins such as ['https://console.example:8090']"
            " (scheme://host[:port], no path)"
        )
        if not isinstance(value, list | tuple):
            raise ValueError(expected)
        origins: list[str] = []
        for origin in value:
            if not isinstance(origin, str) or not _ORIGIN.match(origin):
                raise ValueError(f"{expected}; {origin!r} is not one")
            origins.append(origin)
        return tuple(origins)

    @field_validator("client_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an http:// or https:// URL such as 'http://storage.example:6022'")
        return value.rstrip("/") if value is not None else None

    @property
    def public_client_url(self) -> str:
        """``client-url``, or ``http://`` + ``client-api`` when it is not set."""
        return self.client_url or f"http://{self.client_api}"


class VolumeSection(_Section):
    backend: Literal["vfs"] = "vfs"
    path: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("an absolute directory path such as '/srv/accelshare/volume1'")
        return value


class StorageConfig(_Section):
    storage_proxy: ProxySection = Field(alias="storage-proxy")
    volume: Annotated[dict[str, VolumeSection], Field(min_length=1)]

    @field_validator("volume")
    @classmethod
    def _volume_names(cls, value: dict[str, VolumeSection]) -> dict[str, VolumeSection]:
        for name in value:
            if not re.match(_VOLUME_NAME, name):
                raise ValueError(
                    f"volume names of letters, digits, '_', '.', '-' (1-64), not {name!r}"
                )
        return value


EXPECTED: dict[str, str] = {
    "storage-proxy.node-id": "a name of letters, digits, '_', '.', '-' (1-64), such as 'local'",
    "storage-proxy.secret": f"a string of at least {MIN_SECRET_LENGTH} characters",
    "storage-proxy.token-ttl": "whole seconds between 10 and 604800",
    "volume": "at least one [volume.NAME] table",
    "volume.*.backend": "'vfs'",
    "volume.*.path": "an absolute directory path such as '/srv/accelshare/volume1'",
}
_HIDDEN_KEYS = frozenset({"storage-proxy.secret"})


def _key_of(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "(file)"


def _pattern(key: str) -> str:
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "volume":
        return f"volume.*.{parts[2]}"
    return key


def _received(data: Mapping[str, Any], err: Mapping[str, Any]) -> Any:
    if err["type"] == "missing":
        return _MISSING
    loc: Sequence[int | str] = err["loc"]
    if _key_of(loc) in _HIDDEN_KEYS:
        return "(hidden)"
    value: Any = data
    for part in loc:
        if not (isinstance(value, Mapping) and part in value):
            return err.get("input", _MISSING)
        value = value[part]
    return value


def _expected(err: Mapping[str, Any]) -> str:
    key = _key_of(err["loc"])
    if err["type"] == "extra_forbidden":
        return "no such key (a typo?)"
    if err["type"] == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if _pattern(key) in EXPECTED:
        return EXPECTED[_pattern(key)]
    if err["type"] == "missing":
        return "a value (the key is required)"
    return str(err["msg"]).removeprefix("Input should be ")


def parse_storage_config(data: Mapping[str, Any], *, source: str = "storage.toml") -> StorageConfig:
    """Validate parsed TOML data (pure); errors name ``source``, key, expected, received."""
    try:
        return StorageConfig.model_validate(dict(data))
    except ValidationError as e:
        err = e.errors()[0]
        raise StorageConfigError(
            source, _key_of(err["loc"]), _expected(err), _received(data, err)
        ) from None


def load_storage_config(path: Path) -> StorageConfig:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise StorageConfigError(str(path), "(file)", "valid TOML", str(e)) from None
    except OSError as e:
        raise StorageConfigError(str(path), "(file)", "a readable file", str(e)) from None
    return parse_storage_config(data, source=str(path))
