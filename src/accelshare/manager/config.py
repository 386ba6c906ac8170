"""``manager.toml``: the manager's local configuration file (validated at start).

Keys are kebab-case like Backend.AI's.  Every section and key is optional; an empty
file (or none) gives an embedded SQLite manager under ``./.accelshare``::

    [manager]
    data-dir = "./.accelshare"             # state: SQLite DB, credentials, cookie secret
    service-addr = "127.0.0.1:8081"

    [db]
    url = "postgresql+asyncpg://postgres@127.0.0.1:5432/accelshare"
    # or Backend.AI's form: type = "postgresql", addr = "127.0.0.1:5432", name, user, password
    # default: "sqlite+aiosqlite:///<data-dir>/manager.db"

    cluster-secret = "..."                 # shared with the agents (or $ACCELSHARE_CLUSTER_SECRET)
    agent-timeout = 30.0                   # seconds without a heartbeat before an agent is LOST
    stale-bind-timeout = 60.0              # re-bind sessions a dead replica left mid-bind
    schedule-interval = 2.0                # the scheduler's timer (passes also run on events)

    [api]
    max-clock-skew = 900                   # seconds a signed request's Date may be off

    [api.graphql]                          # /admin/gql cost limits (docs/reliability.md)
    max-depth = 20
    max-aliases = 30
    max-fields = 1000
    max-tokens = 5000

    [api.login]                            # failed-login throttling (docs/reliability.md)
    window = 300
    max-failures-per-address = 30
    max-failures-per-account-address = 5
    max-failures-per-account = 50

    [api.connections]                      # long-lived connections (docs/reliability.md)
    max-event-streams-per-user = 32
    max-terminals-per-user = 16
    max-app-websockets-per-user = 64
    max-total = 2048                       # all users together
    retry-after = 5

    [apps]                                 # app pages on an origin of their own (docs/manager.md)
    listen-addr = "0.0.0.0:8091"           # a second listener for them, and/or
    origin = "https://apps.example.com"    # the origin browsers use (a host name routed here)

    [bootstrap]
    admin-email = "admin@accelshare.local"

Unknown keys inside these sections are errors (a typo must not be ignored);
unknown *sections* are left to other components (``[etcd]``, ``[logging]``...).
A bad value raises :class:`ManagerConfigError` naming the file, key, expected and
received value.  Relative paths are relative to the working directory.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import URL, make_url

from accelshare.common import CommonValueError

__all__ = [
    "ENV_CLUSTER_SECRET",
    "ApiConfig",
    "AppsConfig",
    "BootstrapConfig",
    "DBConfig",
    "GraphQLLimitsConfig",
    "LoginThrottleConfig",
    "ManagerConfig",
    "ManagerConfigError",
    "ManagerSection",
    "load_manager_config",
    "normalize_db_url",
    "parse_host_port",
]

DEFAULT_DATA_DIR = Path(".accelshare")
ENV_CLUSTER_SECRET = "ACCELSHARE_CLUSTER_SECRET"


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Section(BaseModel):
    model_config = ConfigDict(
        alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True
    )


def parse_host_port(value: str, default_port: int | None = None) -> tuple[str, int]:
    """``"127.0.0.1:8081"`` -> ``("127.0.0.1", 8081)``; ``"[::1]:80"`` for IPv6."""
    host, sep, port = value.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"expected 'host:port', got {value!r}")
        host, port = value, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected 'host:port' with a port in 1..65535, got {value!r}")
    return host, int(port)


class ManagerSection(_Section):
    data_dir: Path = DEFAULT_DATA_DIR
    service_addr: str = "127.0.0.1:8081"
    # Shared with the agents (X-Accelshare-Cluster-Secret); else $ACCELSHARE_CLUSTER_SECRET,
    # else <data-dir>/cluster-secret (created once, mode 0600).
    cluster_secret: SecretStr | None = None
    agent_timeout: float = Field(default=30.0, gt=0)  # seconds of silence before LOST
    schedule_interval: float = Field(default=2.0, gt=0)  # timer between passes
    sweep_interval: float = Field(default=5.0, gt=0)  # LOST / pending-timeout sweeps
    agent_rpc_timeout: float = Field(default=30.0, gt=0)  # create/destroy kernel calls
    # a session stuck between SCHEDULED and CREATING this long (its replica died mid-bind)
    # is bound again by a live replica; default: agent-rpc-timeout + 30 s
    stale_bind_timeout: float | None = Field(default=None, gt=0)
    # storage folders deleted to the trash are purged (their bytes too) after this many
    # seconds; 0 keeps them until a user purges them
    trash_max_age: float = Field(default=30 * 86400.0, ge=0)

    @field_validator("service_addr")
    @classmethod
    def _check_addr(cls, value: str) -> str:
        parse_host_port(value)
        return value

    @property
    def service_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.service_addr)


class DBConfig(_Section):
    url: str | None = None
    type: Literal["sqlite", "postgresql"] | None = None
    addr: str | dict[str, Any] | None = None  # "host:port" or {host = "...", port = 5432}
    name: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    pool_size: int = Field(default=8, ge=1)
    max_overflow: int = Field(default=16, ge=0)
    busy_timeout: float = Field(default=10.0, gt=0)  # seconds SQLite waits for a lock
    echo: bool = False

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            normalize_db_url(value)
        return value

    def resolve_url(self, data_dir: Path) -> URL:
        """The SQLAlchemy async URL: ``url``, else Backend.AI's fields, else SQLite."""
        if self.url is not None:
            return normalize_db_url(self.url)
        if self.type == "postgresql":
            host, port = "127.0.0.1", 5432
            if isinstance(self.addr, str):
                host, port = parse_host_port(self.addr, 5432)
            elif isinstance(self.addr, dict):
                host = str(self.addr.get("host", host))
                port = int(self.addr.get("port", port))
            return URL.create(
                "postgresql+asyncpg",
                username=self.user,
                password=self.password.get_secret_value() if self.password else None,
                host=host,
                port=port,
                database=self.name or "accelshare",
            )
        path = Path(self.name) if self.type == "sqlite" and self.name else data_dir / "manager.db"
        return URL.create("sqlite+aiosqlite", database=str(path))


def normalize_db_url(raw: str) -> URL:
    """Pick the async driver: ``postgresql://`` -> asyncpg, ``sqlite://`` -> aiosqlite."""
    try:
        url = make_url(raw)
    except Exception as e:  # sqlalchemy raises ArgumentError for junk
        raise ValueError(f"not a database URL: {e}") from None
    backend = url.get_backend_name()
    if backend in {"postgresql", "postgres"}:
        return url.set(drivername="postgresql+asyncpg")
    if backend == "sqlite":
        return url.set(drivername="sqlite+aiosqlite")
    raise ValueError(f"unsupported database {backend!r}: expected sqlite or postgresql")


class GraphQLLimitsConfig(_Section):
    """``[api.graphql]``: the cost limits of ``/admin/gql`` (docs/reliability.md)."""

    max_depth: int = Field(default=20, ge=1, le=1000)
    max_aliases: int = Field(default=30, ge=0, le=100_000)
    max_fields: int = Field(default=1000, ge=1, le=1_000_000)
    max_tokens: int = Field(default=5000, ge=10, le=1_000_000)


class LoginThrottleConfig(_Section):
    """``[api.login]``: failed password logins (docs/reliability.md, "Login throttling").

    Failures are counted over the last ``window`` seconds: ``max-failures-per-address``
    from one client address (any account) throttles that address; per account, from one
    address, ``max-failures-per-account-address``; ``max-failures-per-account`` from
    all addresses together throttles the account everywhere, for at most ``window``
    seconds after the failures that reached the limit."""

    window: float = Field(default=300.0, gt=0, le=86_400)
    max_failures_per_address: int = Field(default=30, ge=1)
    max_failures_per_account_address: int = Field(default=5, ge=1)
    max_failures_per_account: int = Field(default=50, ge=1)


class ConnectionLimitsConfig(_Section):
    """``[api.connections]``: long-lived connections (event streams, web terminals, app
    WebSockets) a user may hold at once, each kind counted per user; ``max-total``: all
    kinds of all users together on this manager; ``retry-after``: seconds in the
    ``Retry-After`` of a ``max-total`` refusal (docs/reliability.md)."""

    max_event_streams_per_user: int = Field(default=32, ge=1, le=100_000)
    max_terminals_per_user: int = Field(default=16, ge=1, le=100_000)
    max_app_websockets_per_user: int = Field(default=64, ge=1, le=100_000)
    max_total: int = Field(default=2048, ge=1, le=1_000_000)
    retry_after: int = Field(default=5, ge=1, le=3600)


class ApiConfig(_Section):
    max_clock_skew: float = Field(default=900.0, gt=0)  # ±15 minutes
    session_cookie_name: str = "accelshare_session"
    session_cookie_max_age: int = Field(default=12 * 3600, gt=0)
    session_cookie_secure: bool = False  # set true behind HTTPS
    session_cookie_secret_file: Path | None = None  # default <data-dir>/cookie-secret
    graphql: GraphQLLimitsConfig = GraphQLLimitsConfig()
    login: LoginThrottleConfig = LoginThrottleConfig()
    connections: ConnectionLimitsConfig = ConnectionLimitsConfig()


_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*"})


class AppsConfig(_Section):
    """``[apps]``: where the app proxy serves app pages to browsers.

    Unset (both keys absent): on the console's origin (app pages can then use the
    user's login cookie: for trusted apps and development only).  ``listen-addr``: a
    second listener of the manager serves them (a different port is a different
    origin); ``origin``: their public origin (a host name of their own routed to either
    listener, e.g. through a reverse proxy; default with ``listen-addr``:
    ``http://<its host>:<its port>``, and required when that host is a wildcard such as
    ``0.0.0.0``: the hand-off redirect goes to a configured address, never to the host
    name a request's ``Host`` header claims).  Browsers reach an app there with a short-lived token
    (``token-ttl`` seconds, single use) exchanged for a cookie of that origin bound to
    one session (``cookie-max-age`` seconds); the login cookie is not accepted there."""

    origin: str | None = None
    listen_addr: str | None = None
    token_ttl: float = Field(default=30.0, gt=0, le=600)
    cookie_max_age: int = Field(default=8 * 3600, gt=0)

    @field_validator("listen_addr")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_host_port(value)
        return value

    @field_validator("origin")
    @classmethod
    def _check_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username
        ):
            raise ValueError(
                f"expected an origin such as 'https://apps.example.com' (scheme, host and "
                f"optional port, no path), got {value!r}"
            )
        return f"{parts.scheme}://{parts.netloc}".lower()

    @model_validator(mode="after")
    def _origin_known(self) -> AppsConfig:
        if self.origin is None and self.listen_addr is not None:
            host, port = parse_host_port(self.listen_addr)
            if host in _WILDCARD_HOSTS:
                raise ValueError(
                    f"origin: required with listen-addr = {self.listen_addr!r} (every"
                    " interface): expected the apps origin browsers use, such as"
                    f" 'http://apps.example.com:{port}' (the hand-off redirect goes there,"
                    " never to a request's Host header)"
                )
        return self

    @property
    def public_origin(self) -> str | None:
        """``origin``, else ``http://<listen-addr host>:<port>``; None when not isolated."""
        if self.origin is not None or self.listen_addr is None:
            return self.origin
        host, port = parse_host_port(self.listen_addr)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def isolated(self) -> bool:
        return self.origin is not None or self.listen_addr is not None


class BootstrapConfig(_Section):
    domain: str = "default"
    group: str = "default"
    scaling_group: str = "default"
    resource_policy: str = "default"
    admin_email: str = "admin@accelshare.local"
    credentials_file: Path | None = None  # default <data-dir>/admin-credentials.env

    @field_validator("admin_email")
    @classmethod
    def _check_email(cls, value: str) -> str:
        local, at, domain = value.partition("@")
        if not at or not local or not domain or any(c.isspace() for c in value):
            raise ValueError(f"expected an email address, got {value!r}")
        return value


class ManagerConfig(BaseModel):
    """The whole file.  Unknown top-level sections belong to other components."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    manager: ManagerSection = ManagerSection()
    db: DBConfig = DBConfig()
    api: ApiConfig = ApiConfig()
    apps: AppsConfig = AppsConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()
    source: Path | None = Field(default=None, exclude=True)

    @property
    def data_dir(self) -> Path:
        return self.manager.data_dir

    @property
    def db_url(self) -> URL:
        return self.db.resolve_url(self.data_dir)

    @property
    def credentials_file(self) -> Path:
        return self.bootstrap.credentials_file or self.data_dir / "admin-credentials.env"

    @property
    def cluster_secret_file(self) -> Path:
        return self.data_dir / "cluster-secret"

    @property
    def cookie_secret_file(self) -> Path:
        return self.api.session_cookie_secret_file or self.data_dir / "cookie-secret"


class ManagerConfigError(CommonValueError):
    """A manager.toml that cannot be used; the message names file, key and values."""

    def __init__(self, file: str, key: str, expected: str, received: Any) -> None:
        got = "" if received is None else f" (received {received!r})"
        super().__init__(
            f"{file}: {key}: {expected}{got}",
            field=key,
            expected=expected,
            received=received,
        )
        self.file = file


def load_manager_config(path: Path | None = None) -> ManagerConfig:
    """Read and validate ``path`` (``None``: all defaults)."""
    if path is None:
        return ManagerConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManagerConfigError(str(path), "<file>", "expected an existing file", None) from None
    except tomllib.TOMLDecodeError as e:
        raise ManagerConfigError(str(path), "<syntax>", f"not valid TOML: {e}", None) from None
    try:
        config = ManagerConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        expected = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            expected = "unknown key (the known ones are listed in docs/manager.md)"
        raise ManagerConfigError(str(path), key, expected, first.get("input")) from None
    return config.model_copy(update={"source": path})
