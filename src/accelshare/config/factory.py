"""Open "the store the daemons use" from ``ConfigStoreSettings`` (settings.py)."""

from __future__ import annotations

from .backend import KVBackend
from .settings import ConfigStoreSettings, load_config_store_settings
from .store import ConfigStore, make_scope_prefix_map

__all__ = ["build_backend", "open_config_store"]


def build_backend(settings: ConfigStoreSettings, *, create: bool = True) -> KVBackend:
    """The backend named by ``settings``, not yet connected.

    ``create=False``: a missing embedded store is :class:`ConfigStoreNotFound` (on first
    use) instead of a new, empty one; etcd is unaffected.
    """
    if settings.backend == "etcd":
        from .etcd import EtcdBackend  # grpc is heavy: import it only when needed

        etcd = settings.etcd
        return EtcdBackend(
            host=etcd.host,
            port=etcd.port,
            user=etcd.user,
            password=etcd.password.get_secret_value() if etcd.password else None,
            timeout_s=etcd.timeout_s,
            reconnect_timeout_s=etcd.reconnect_timeout_s,
        )
    from .embedded import EmbeddedBackend

    embedded = settings.embedded
    return EmbeddedBackend(
        embedded.path,
        timeout_s=embedded.timeout_s,
        poll_interval_s=embedded.poll_interval_s,
        create=create,
    )


async def open_config_store(
    settings: ConfigStoreSettings | None = None,
    *,
    scaling_group: str | None = None,
    node_id: str | None = None,
    check: bool = True,
    create: bool = True,
) -> ConfigStore:
    """Open the configured store (from the environment if ``settings`` is None).

    ``scaling_group`` / ``node_id`` default to the settings' (agent.toml ``[agent]``).  With
    ``check`` one read is made right away, so that a daemon refuses to start with
    ``ConfigStoreUnavailable`` instead of failing later.  ``create=False``: an embedded
    store whose file does not exist is not made; the first read raises
    ``ConfigStoreNotFound`` (``accelshare mgr etcd`` without ``--create``).
    """
    if settings is None:
        settings = load_config_store_settings()
    store = ConfigStore(
        build_backend(settings, create=create),
        namespace=settings.namespace,
        key_prefix=settings.key_prefix,
        scope_prefix_map=make_scope_prefix_map(
            scaling_group=scaling_group if scaling_group is not None else settings.scaling_group,
            node_id=node_id if node_id is not None else settings.node_id,
        ),
    )
    if check:
        try:
            await store.get("config")
        except BaseException:
            await store.close()
            raise
    return store
