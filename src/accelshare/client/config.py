"""Where the client finds its endpoint and keypair.

Precedence (first wins): explicit arguments, environment variables, the config file.

| setting | environment (accelshare / Backend.AI name) | config file key |
|---|---|---|
| endpoint | ``ACCELSHARE_ENDPOINT`` / ``BACKEND_ENDPOINT`` | ``endpoint`` |
| access key | ``ACCELSHARE_ACCESS_KEY`` / ``BACKEND_ACCESS_KEY`` | ``access_key`` |
| secret key | ``ACCELSHARE_SECRET_KEY`` / ``BACKEND_SECRET_KEY`` | ``secret_key`` |

The config file is ``$ACCELSHARE_CLIENT_CONFIG`` or ``~/.config/accelshare/client.toml``;
a shell-style env file (``KEY=VALUE`` lines, such as the ``client.env`` that
``accelshare dev up`` writes) works too when its name ends in ``.env``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_ENDPOINT", "ClientConfig", "ClientConfigError", "load_client_config"]

DEFAULT_ENDPOINT = "http://127.0.0.1:8081"

_ENV_NAMES = {
    "endpoint": ("ACCELSHARE_ENDPOINT", "BACKEND_ENDPOINT"),
    "access_key": ("ACCELSHARE_ACCESS_KEY", "BACKEND_ACCESS_KEY"),
    "secret_key": ("ACCELSHARE_SECRET_KEY", "BACKEND_SECRET_KEY"),
}


class ClientConfigError(ValueError):
    """The client configuration is missing or malformed; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    endpoint: str
    access_key: str
    secret_key: str
    timeout_s: float = 30.0

    def __repr__(self) -> str:  # never print the secret
        return f"ClientConfig(endpoint={self.endpoint!r}, access_key={self.access_key!r})"


def _read_text(path: Path) -> str:
    """The file's text; a folder, an unreadable file or bytes that are not UTF-8 are a
    :class:`ClientConfigError` naming the file (they raised other errors before)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ClientConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ClientConfigError(f"{path}: cannot read: {e.strerror or e}") from None


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(_read_text(path).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep:
            raise ClientConfigError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        values[key.strip()] = value.strip().strip("'\"")
    out: dict[str, str] = {}
    for field, names in _ENV_NAMES.items():
        for name in names:
            if name in values:
                out[field] = values[name]
                break
    return out


def _read_file(path: Path) -> dict[str, str]:
    if path.suffix == ".env":
        return _read_env_file(path)
    try:
        data = tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ClientConfigError(f"{path}: not valid TOML: {e}") from e
    out: dict[str, str] = {}
    for key in ("endpoint", "access_key", "secret_key"):
        value = data.get(key, data.get(key.replace("_", "-")))
        if value is None:
            continue
        if not isinstance(value, str):
            # a secret key is never echoed, even a malformed one
            shown = f"a {type(value).__name__}" if key == "secret_key" else repr(value)
            raise ClientConfigError(f"{path}: key {key!r}: expected a string, received {shown}")
        out[key] = value
    return out


def load_client_config(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> ClientConfig:
    """Resolve the client configuration; raises :class:`ClientConfigError` when keys are missing."""
    environ = os.environ if env is None else env
    path = config_file
    if path is None and environ.get("ACCELSHARE_CLIENT_CONFIG"):
        path = Path(environ["ACCELSHARE_CLIENT_CONFIG"])
    if path is None:
        default = Path.home() / ".config" / "accelshare" / "client.toml"
        path = default if default.exists() else None
    from_file: dict[str, str] = {}
    if path is not None:
        if not path.exists():
            raise ClientConfigError(f"client config file {path} does not exist")
        from_file = _read_file(path)

    def resolve(field: str, explicit: str | None) -> str | None:
        if explicit:
            return explicit
        for name in _ENV_NAMES[field]:
            if environ.get(name):
                return environ[name]
        return from_file.get(field)

    resolved_endpoint = resolve("endpoint", endpoint) or DEFAULT_ENDPOINT
    ak = resolve("access_key", access_key)
    sk = resolve("secret_key", secret_key)
    if not ak or not sk:
        raise ClientConfigError(
            "no API keypair configured: set ACCELSHARE_ACCESS_KEY and ACCELSHARE_SECRET_KEY "
            "(for a local cluster: `source .accelshare/client.env`)"
        )
    return ClientConfig(endpoint=resolved_endpoint.rstrip("/"), access_key=ak, secret_key=sk)
