"""The storage volumes of the cluster, as Backend.AI's ``storage_volume_list`` shows them.

The manager finds storage proxies in the configuration store under Backend.AI's keys
(docs/storage.md)::

    volumes/proxies/<proxy>/manager_api   http://HOST:PORT of its manager-facing API
    volumes/proxies/<proxy>/client_api    http://HOST:PORT clients are sent to
    volumes/proxies/<proxy>/secret        sent in X-Accelshare-Storage-Secret

and asks each for its volumes (``GET /v1/volumes``, :mod:`accelshare.protocol.storage`).
A volume is named ``<proxy>:<volume>`` (Backend.AI's vfolder *host*).

A proxy that is misconfigured, does not answer or refuses the secret is an
:class:`StorageProxyError` naming the proxy, its address and what went wrong: a list
that silently left out a proxy's volumes would look like lost data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from accelshare.config import ConfigStore
from accelshare.protocol.storage import STORAGE_SECRET_HEADER, VolumeInfo, VolumeList

__all__ = [
    "PROXIES_PREFIX",
    "ProxyAddress",
    "StorageProxyError",
    "StorageVolume",
    "find_volume",
    "list_volumes",
    "read_proxies",
]

PROXIES_PREFIX = "volumes/proxies"
_TIMEOUT_S = 10.0


class StorageProxyError(RuntimeError):
    """A storage proxy cannot be asked (its keys, its address, its answer)."""


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    name: str
    manager_api: str
    secret: str


@dataclass(frozen=True, slots=True)
class StorageVolume:
    proxy: str
    info: VolumeInfo

    @property
    def id(self) -> str:
        return f"{self.proxy}:{self.info.name}"


def _proxy_address(name: str, keys: Any) -> ProxyAddress:
    where = f"{PROXIES_PREFIX}/{name}"
    if not isinstance(keys, Mapping):
        raise StorageProxyError(
            f"{where}: expected the keys manager_api and secret, received the value {keys!r}"
        )
    values: dict[str, str] = {}
    for key in ("manager_api", "secret"):
        value = keys.get(key)
        if not isinstance(value, str) or not value:
            raise StorageProxyError(
                f"{where}/{key}: expected a non-empty string, received {value!r}"
                " (docs/storage.md, the configuration store keys)"
            )
        values[key] = value
    api = values["manager_api"].rstrip("/")
    if not api.startswith(("http://", "https://")):
        raise StorageProxyError(
            f"{where}/manager_api: expected http://HOST:PORT, received {values['manager_api']!r}"
        )
    return ProxyAddress(name=name, manager_api=api, secret=values["secret"])


async def read_proxies(store: ConfigStore) -> list[ProxyAddress]:
    """The storage proxies the configuration store names, by name."""
    tree = await store.get_prefix(PROXIES_PREFIX)
    return [_proxy_address(name, tree[name]) for name in sorted(tree)]


async def _volumes_of(
    proxy: ProxyAddress, transport: httpx.AsyncBaseTransport | None
) -> list[StorageVolume]:
    url = f"{proxy.manager_api}/v1/volumes"
    what = f"storage proxy {proxy.name!r} at {proxy.manager_api}"
    try:
        async with httpx.AsyncClient(transport=transport, timeout=_TIMEOUT_S) as client:
            response = await client.get(url, headers={STORAGE_SECRET_HEADER: proxy.secret})
    except httpx.HTTPError as e:
        raise StorageProxyError(f"{what} does not answer: {type(e).__name__}: {e}") from None
    if response.status_code != 200:
        try:
            detail = str(response.json().get("detail"))
        except ValueError:
            detail = response.text[:200]
        raise StorageProxyError(
            f"{what} refused GET /v1/volumes with {response.status_code}: {detail}"
        )
    try:
        volumes = VolumeList.model_validate_json(response.content).volumes
    except ValidationError as e:
        raise StorageProxyError(f"{what} answered GET /v1/volumes with a bad body: {e}") from None
    return [StorageVolume(proxy.name, info) for info in volumes]


async def list_volumes(
    store: ConfigStore, *, transport: httpx.AsyncBaseTransport | None = None
) -> list[StorageVolume]:
    """Every volume of every proxy (asked at once), ordered by ``proxy:volume``."""
    proxies = await read_proxies(store)
    answers = await asyncio.gather(*(_volumes_of(p, transport) for p in proxies))
    return sorted((v for volumes in answers for v in volumes), key=lambda v: v.id)


async def find_volume(
    store: ConfigStore, volume_id: str, *, transport: httpx.AsyncBaseTransport | None = None
) -> StorageVolume:
    """The volume ``<proxy>:<volume>``; a :class:`LookupError` naming what exists when
    there is no such proxy or volume, a :class:`ValueError` for a malformed id."""
    proxy_name, sep, volume_name = volume_id.partition(":")
    if not sep or not proxy_name or not volume_name:
        raise ValueError(
            f"id: expected <proxy>:<volume> (e.g. local:volume1), received {volume_id!r}"
        )
    proxies = {p.name: p for p in await read_proxies(store)}
    proxy = proxies.get(proxy_name)
    if proxy is None:
        raise LookupError(
            f"id: no storage proxy {proxy_name!r}; the proxies are {sorted(proxies)}"
            f" (received {volume_id!r})"
        )
    volumes = await _volumes_of(proxy, transport)
    for volume in volumes:
        if volume.info.name == volume_name:
            return volume
    raise LookupError(
        f"id: the storage proxy {proxy_name!r} has no volume {volume_name!r}; its volumes are"
        f" {sorted(v.id for v in volumes)}"
    )
