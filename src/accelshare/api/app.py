"""The manager's FastAPI application: authentication, errors, health, and the control plane.

Two ways to build it:

* :func:`create_app` — from parts (a credential store, auth settings, optionally a
  database and a :class:`~accelshare.manager.runtime.Manager`); unit tests use an
  in-memory store and a frozen clock;
* :func:`create_manager_app` — from ``manager.toml``: opens the database, creates or
  upgrades the schema, bootstraps the defaults and the superadmin, loads (or creates)
  the cookie and cluster secrets, opens the config store and builds the control plane;
  its lifespan starts the scheduler and the LOST sweep and stops them (binds in flight
  get a few seconds), then closes the store and disposes the engine.

Routes: ``GET /`` (API version, public; Backend.AI clients negotiate with it),
``GET /health`` (public), ``GET /whoami``, ``GET /auth/role``, ``POST /auth/login``,
``POST /auth/logout``; with a manager also the sessions (:mod:`.sessions`), agents
(:mod:`.agents`), agent endpoints (:mod:`.internal`), slot types and the config tree
(:mod:`.config_routes`), admin (:mod:`.admin`), GraphQL at ``/admin/gql`` (:mod:`.gql`),
``/metrics``, the live streams ``/events/...`` (:mod:`.stream`, :mod:`.console_support`)
and the web console at ``/console/`` (:mod:`accelshare.web`; browsers asking for ``/``
are redirected there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Protocol

import httpx
from fastapi import FastAPI, Request

from accelshare import __version__
from accelshare.bus import RedisBus, load_bus_settings
from accelshare.config import (
    ConfigStore,
    ConfigStoreSettings,
    load_config_store_settings,
    open_config_store,
)
from accelshare.config.settings import DEFAULT_EMBEDDED_PATH
from accelshare.manager.assembly import open_database, shared_used_tokens
from accelshare.manager.bootstrap import load_or_create_secret
from accelshare.manager.clock import Clock, utcnow
from accelshare.manager.config import ENV_CLUSTER_SECRET, ManagerConfig, parse_host_port
from accelshare.manager.credentials import CredentialStore, DBCredentialStore
from accelshare.manager.enums import UserRole
from accelshare.manager.runtime import Manager, ManagerOptions
from accelshare.manager.store_errors import DATABASE_ERRORS

from . import (
    admin,
    agents,
    app_proxy,
    bai_events,
    compat,
    config_routes,
    execute,
    folders,
    images,
    internal,
    login,
    metrics_route,
    session_files,
    sessions,
    stream_apps,
    unsupported,
)
from .app_origin import AppOrigin, AppsOriginMiddleware, UsedTokens
from .auth import Authenticator, AuthSettings, CurrentIdentity
from .conn_limits import ConnectionLimits, ConnectionSettings
from .gql_limits import GraphQLLimits
from .limits import PathCheck, install_body_limit
from .login_throttle import LoginThrottle, ThrottleSettings
from .problems import ServiceUnavailable, install_problem_handlers
from .signing import API_VERSION

__all__ = [
    "apps_origin_from_config",
    "auth_settings_from_config",
    "cluster_secret_from_config",
    "config_store_settings",
    "connection_limits_from_config",
    "create_app",
    "create_manager_app",
    "graphql_limits_from_config",
    "login_throttle_from_config",
    "manager_options_from_config",
]

log = logging.getLogger(__name__)

_NO_ANSWER: tuple[type[Exception], ...] = (*DATABASE_ERRORS, OSError)
"""A health check's ping failing: the store's errors and a socket's."""


class DatabaseHandle(Protocol):
    """What the application itself does with the manager's database: ask whether it
    answers (``GET /health``).  Every query goes through the manager's services."""

    @property
    def dialect(self) -> str: ...

    async def ping(self) -> None: ...


def create_app(
    *,
    store: CredentialStore,
    settings: AuthSettings,
    db: DatabaseHandle | None = None,
    used_tokens: UsedTokens | None = None,
    title: str = "accelshare manager",
    manager: Manager | None = None,
    apps: AppOrigin | None = None,
    graphql_limits: GraphQLLimits | None = None,
    login_throttle: LoginThrottle | None = None,
    connection_limits: ConnectionLimits | None = None,
) -> FastAPI:
    """The application with authentication, problem+json errors and the base routes
    (plus the control plane's routes when a ``manager`` is given).  ``apps``: app pages
    on an origin of their own (``[apps]``; :mod:`.app_origin`), recording the used
    hand-off tokens in ``used_tokens`` when given (the database the replicas share)."""
    app = FastAPI(title=title, version=__version__)
    app.state.authenticator = Authenticator(
        store, settings, on_used=manager.key_usage.note if manager is not None else None
    )
    app.state.db = db
    app.state.manager = manager
    app.state.apps = apps
    app.state.graphql_limits = graphql_limits or GraphQLLimits()
    app.state.login_throttle = login_throttle or LoginThrottle()
    app.state.connection_limits = connection_limits or ConnectionLimits()
    if apps is not None:
        if used_tokens is not None and apps.used_tokens is None:
            # single-use hand-off tokens across the replicas sharing the database
            apps.used_tokens = used_tokens
        app.add_middleware(AppsOriginMiddleware, apps=apps)
    install_problem_handlers(app)
    install_body_limit(app)  # 413 over 1 MiB (docs/reliability.md)
    app.add_middleware(PathCheck)  # 400: a NUL or control character in the path

    @app.get("/", tags=["meta"])
    async def hello() -> dict[str, str]:
        """The API version (Backend.AI clients read ``version`` to pick theirs)."""
        return {"version": API_VERSION, "manager": __version__}

    @app.get("/health", tags=["meta"])
    async def health(request: Request) -> dict[str, str]:
        database: DatabaseHandle | None = request.app.state.db
        if database is None:
            return {"status": "ok", "database": "none"}
        try:
            await database.ping()
        except _NO_ANSWER as e:
            log.warning("health: the database does not answer: %s", e)
            raise ServiceUnavailable("The database does not answer") from None
        return {"status": "ok", "database": database.dialect}

    @app.get("/whoami", tags=["auth"])
    async def whoami(identity: CurrentIdentity) -> dict[str, Any]:
        """The authenticated caller: user, role, domain and access key."""
        return identity.to_json()

    @app.get("/auth/role", tags=["auth"])
    async def role(identity: CurrentIdentity) -> dict[str, Any]:
        """Backend.AI's ``GET /auth/role`` shape."""
        return {
            "global_role": "superadmin" if identity.is_superadmin else "user",
            "domain_role": "admin" if identity.role.includes(UserRole.ADMIN) else "user",
            "group_role": None,
        }

    app.include_router(login.router)
    if manager is not None:
        from .gql import create_graphql_router  # strawberry: only with a control plane

        for router in (
            sessions.router,
            agents.router,
            internal.router,
            config_routes.router,
            admin.router,
            images.router,
            metrics_route.router,
            compat.router,  # the official Backend.AI client's extras (docs/compatibility.md)
            folders.router,  # storage folders, Backend.AI's /folders (docs/folders.md)
            app_proxy.router,  # web terminal and app services (the WSProxy role)
            execute.router,  # Backend.AI's execute API (code run in a session)
            session_files.router,  # session upload / download / ls
            bai_events.router,  # Backend.AI's event streams (session events, watch)
            stream_apps.router,  # Backend.AI's stream proxy (backend.ai app / apps)
            unsupported.router,  # 501 for the Backend.AI routes accelshare lacks (last)
        ):
            app.include_router(router)
        app.include_router(create_graphql_router(), prefix="/admin/gql")
        # The web console: live streams, its two helper routes, the static files.
        from accelshare.web import install_console

        from . import console_support, stream

        app.include_router(stream.router)
        app.include_router(console_support.router)
        install_console(app)
    return app


def auth_settings_from_config(
    config: ManagerConfig, *, cookie_secret: bytes, clock: Clock = utcnow
) -> AuthSettings:
    return AuthSettings(
        cookie_secret=cookie_secret,
        max_clock_skew=timedelta(seconds=config.api.max_clock_skew),
        cookie_name=config.api.session_cookie_name,
        cookie_max_age=timedelta(seconds=config.api.session_cookie_max_age),
        cookie_secure=config.api.session_cookie_secure,
        clock=clock,
    )


def graphql_limits_from_config(config: ManagerConfig) -> GraphQLLimits:
    """``[api.graphql]``."""
    section = config.api.graphql
    return GraphQLLimits(
        max_depth=section.max_depth,
        max_aliases=section.max_aliases,
        max_fields=section.max_fields,
        max_tokens=section.max_tokens,
    )


def login_throttle_from_config(config: ManagerConfig) -> LoginThrottle:
    """``[api.login]``."""
    section = config.api.login
    return LoginThrottle(
        ThrottleSettings(
            window_s=section.window,
            max_per_address=section.max_failures_per_address,
            max_per_account_address=section.max_failures_per_account_address,
            max_per_account=section.max_failures_per_account,
        )
    )


def connection_limits_from_config(config: ManagerConfig) -> ConnectionLimits:
    """``[api.connections]``."""
    section = config.api.connections
    return ConnectionLimits(
        ConnectionSettings(
            max_event_streams_per_user=section.max_event_streams_per_user,
            max_terminals_per_user=section.max_terminals_per_user,
            max_app_websockets_per_user=section.max_app_websockets_per_user,
            max_total=section.max_total,
            retry_after_s=section.retry_after,
        )
    )


def apps_origin_from_config(config: ManagerConfig, *, cookie_secret: bytes) -> AppOrigin | None:
    """``[apps]``: None when app pages stay on the console's origin."""
    section = config.apps
    if not section.isolated:
        return None
    port = parse_host_port(section.listen_addr)[1] if section.listen_addr else None
    origin = section.public_origin
    assert origin is not None  # isolated: origin or listen-addr (checked at load)
    return AppOrigin.from_secret(
        cookie_secret,
        origin=origin,
        listen_port=port,
        token_ttl_s=section.token_ttl,
        cookie_max_age_s=section.cookie_max_age,
        secure_cookie=config.api.session_cookie_secure
        or (section.origin or "").startswith("https:"),
    )


def cluster_secret_from_config(config: ManagerConfig) -> str:
    """``[manager] cluster-secret``, else ``$ACCELSHARE_CLUSTER_SECRET``, else the
    ``<data-dir>/cluster-secret`` file (created once, mode 0600, for a local cluster)."""
    if config.manager.cluster_secret is not None:
        return config.manager.cluster_secret.get_secret_value()
    from_env = os.environ.get(ENV_CLUSTER_SECRET, "")
    if from_env:
        return from_env
    return load_or_create_secret(config.cluster_secret_file).decode("utf-8")


def config_store_settings(config: ManagerConfig) -> ConfigStoreSettings:
    """The config store named by manager.toml ``[etcd]`` / ``[config-store]`` and the
    environment (as ``accelshare mgr etcd`` resolves it); the embedded store's default
    file is ``<data-dir>/config-store.db`` (``./.accelshare/config-store.db`` by default,
    where the agents look too)."""
    settings = load_config_store_settings(config.source)
    if settings.backend == "embedded" and settings.embedded.path == DEFAULT_EMBEDDED_PATH:
        embedded = settings.embedded.model_copy(
            update={"path": config.data_dir / "config-store.db"}
        )
        settings = settings.model_copy(update={"embedded": embedded})
    return settings


def manager_options_from_config(config: ManagerConfig, cluster_secret: str) -> ManagerOptions:
    section = config.manager
    return ManagerOptions(
        cluster_secret=cluster_secret,
        agent_timeout_s=section.agent_timeout,
        schedule_interval_s=section.schedule_interval,
        sweep_interval_s=section.sweep_interval,
        agent_rpc_timeout_s=section.agent_rpc_timeout,
        stale_bind_timeout_s=section.stale_bind_timeout,
        default_scaling_group=config.bootstrap.scaling_group,
        trash_max_age_s=section.trash_max_age or None,
    )


async def create_manager_app(
    config: ManagerConfig,
    *,
    clock: Clock = utcnow,
    auto_upgrade: bool = True,
    config_store: ConfigStore | None = None,
    agent_transport: httpx.AsyncBaseTransport | None = None,
    storage_transport: httpx.AsyncBaseTransport | None = None,
    background: bool = True,
) -> FastAPI:
    """Open the database, bring the schema to head, bootstrap, and build the app.

    ``config_store``: the cluster's config store (default: the one ``manager.toml`` and
    the environment name, as ``accelshare mgr etcd`` resolves it; closed at shutdown
    only when opened here).  ``agent_transport``: an httpx transport for the agent RPC
    (tests route it to hollow agents).  ``background=False`` starts no loops (tests
    drive passes and sweeps by hand).
    """
    bus_settings = load_bus_settings(config.source)  # a bad [redis] fails before anything opens
    db = await open_database(config, clock=clock, auto_upgrade=auto_upgrade)
    owned_store: ConfigStore | None = None
    try:
        secret = load_or_create_secret(config.cookie_secret_file)
        cluster_secret = cluster_secret_from_config(config)
        if config_store is None:
            owned_store = await open_config_store(config_store_settings(config))
            config_store = owned_store
    except BaseException:
        await db.dispose()
        raise
    manager = Manager(
        db=db,
        store=config_store,
        options=manager_options_from_config(config, cluster_secret),
        clock=clock,
        agent_transport=agent_transport,
        storage_transport=storage_transport,
        bus=RedisBus(bus_settings.redis, client_name="accelshare-manager")
        if bus_settings.redis is not None
        else None,
    )
    app = create_app(
        store=DBCredentialStore(db),
        settings=auth_settings_from_config(config, cookie_secret=secret, clock=clock),
        db=db,
        used_tokens=shared_used_tokens(db),
        manager=manager,
        apps=apps_origin_from_config(config, cookie_secret=secret),
        graphql_limits=graphql_limits_from_config(config),
        login_throttle=login_throttle_from_config(config),
        connection_limits=connection_limits_from_config(config),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await manager.start(background=background)
            yield
        finally:
            try:
                await manager.stop()
            finally:
                if owned_store is not None:
                    await owned_store.close()
                await db.dispose()

    app.router.lifespan_context = lifespan
    return app
