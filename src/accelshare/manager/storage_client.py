"""The manager's side of the storage proxy's contract (:mod:`accelshare.protocol.storage`).

Proxies are found in the configuration store under Backend.AI's keys::

    volumes/proxies/<proxy>/manager_api   http://127.0.0.1:6021   (the manager-facing address)
    volumes/proxies/<proxy>/client_api    http://127.0.0.1:6022   (what clients are sent to)
    volumes/proxies/<proxy>/secret        the shared secret of the manager-facing API
    volumes/default_host                  <proxy>:<volume>

A folder's ``host`` is ``<proxy>:<volume>``.  :class:`StorageProxies` reads the keys on
every call (a proxy added with ``accelshare mgr etcd put`` is seen at once) and keeps one
:class:`httpx.AsyncClient` per manager address.  A proxy's refusal (RFC 9457 problem)
becomes a :class:`StorageError` keeping its ``type``; an unreachable proxy a
:class:`~accelshare.manager.errors.Unavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from accelshare.config import ConfigStore
from accelshare.protocol.storage import (
    STORAGE_SECRET_HEADER,
    DeleteRequest,
    DownloadRequest,
    FileListPage,
    FileListRequest,
    FolderClone,
    FolderCreate,
    FolderMount,
    FolderQuota,
    FolderRef,
    FolderUsage,
    MkdirRequest,
    MoveRequest,
    StorageErrorType,
    TransferTicket,
    UploadRequest,
    VolumeInfo,
    VolumeList,
)

from .errors import InvalidRequest, ManagerError, NotFound, Unavailable

__all__ = [
    "DEFAULT_HOST_KEY",
    "PROXIES_KEY",
    "ProxyAddress",
    "StorageError",
    "StorageProxies",
    "StorageProxy",
    "StorageVolume",
    "split_host",
]

PROXIES_KEY = "volumes/proxies"
DEFAULT_HOST_KEY = "volumes/default_host"

M = TypeVar("M", bound=BaseModel)

# a proxy's refusal -> the status the manager answers with
_STATUS_OF: dict[StorageErrorType, int] = {
    StorageErrorType.BAD_REQUEST: 400,
    StorageErrorType.BAD_PATH: 400,
    StorageErrorType.NO_VOLUME: 404,
    StorageErrorType.NO_FOLDER: 404,
    StorageErrorType.NO_FILE: 404,
    StorageErrorType.EXISTS: 409,
    StorageErrorType.NOT_EMPTY: 409,
    StorageErrorType.OVER_QUOTA: 412,
    StorageErrorType.UPLOAD_CONFLICT: 409,
    StorageErrorType.BAD_TOKEN: 403,
    StorageErrorType.BAD_SECRET: 503,  # the manager's configuration is wrong, not the caller
}


class StorageError(ManagerError):
    """A storage proxy refused the request (``kind``: its problem ``type``)."""

    def __init__(self, kind: StorageErrorType, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.kind = kind
        self.status = _STATUS_OF.get(kind, 503)


def split_host(host: str, *, field: str = "host") -> tuple[str, str]:
    """``"proxy:volume"`` -> ``("proxy", "volume")``; anything else is a 400 naming ``field``.

    >>> split_host("local:volume1")
    ('local', 'volume1')
    """
    proxy, sep, volume = host.partition(":")
    if not sep or not proxy or not volume or ":" in volume:
        raise InvalidRequest(
            f"A folder host is <proxy>:<volume> (received {host!r})",
            field=field,
            expected="<proxy>:<volume>",
            received=host,
        )
    return proxy, volume


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    name: str
    manager_api: str
    client_api: str
    secret: str


@dataclass(frozen=True, slots=True)
class StorageVolume:
    """A volume of a proxy, named ``<proxy>:<volume>`` (Backend.AI's folder *host*)."""

    proxy: str
    info: VolumeInfo

    @property
    def id(self) -> str:
        return f"{self.proxy}:{self.info.name}"


class StorageProxy:
    """One proxy's manager-facing API."""

    def __init__(self, address: ProxyAddress, client: httpx.AsyncClient) -> None:
        self.address = address
        self._client = client

    @property
    def name(self) -> str:
        return self.address.name

    async def _call(self, method: str, path: str, body: BaseModel | None = None) -> httpx.Response:
        url = self.address.manager_api.rstrip("/") + path
        headers = {STORAGE_SECRET_HEADER: self.address.secret}
        content = None if body is None else body.model_dump_json().encode()
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await self._client.request(method, url, content=content, headers=headers)
        except httpx.HTTPError as e:
            raise Unavailable(
                f"The storage proxy {self.name!r} at {self.address.manager_api} does not"
                f" answer: {e or type(e).__name__}",
                proxy=self.name,
            ) from None
        if response.status_code >= 400:
            raise self._refusal(response)
        return response

    def _refusal(self, response: httpx.Response) -> ManagerError:
        try:
            problem = response.json()
        except ValueError:
            problem = None
        if not isinstance(problem, Mapping):
            return Unavailable(
                f"The storage proxy {self.name!r} answered {response.status_code}:"
                f" {response.text[:200]!r}",
                proxy=self.name,
            )
        detail = str(problem.get("detail") or problem.get("title") or response.reason_phrase)
        try:
            kind = StorageErrorType(str(problem.get("type", "")).rsplit("/", 1)[-1])
        except ValueError:
            if response.status_code >= 500:
                return Unavailable(
                    f"The storage proxy {self.name!r} failed: {detail}", proxy=self.name
                )
            kind = StorageErrorType.BAD_REQUEST
        extra = {k: problem[k] for k in ("field", "expected", "received") if k in problem}
        return StorageError(kind, detail, **extra)

    async def _json(self, model: type[M], method: str, path: str, body: BaseModel | None) -> M:
        response = await self._call(method, path, body)
        try:
            return model.model_validate_json(response.content)
        except ValidationError as e:
            raise Unavailable(
                f"The storage proxy {self.name!r} answered {path} with an unexpected body: {e}",
                proxy=self.name,
            ) from None

    async def volumes(self) -> list[VolumeInfo]:
        return (await self._json(VolumeList, "GET", "/v1/volumes", None)).volumes

    async def create_folder(self, request: FolderCreate) -> None:
        await self._call("POST", "/v1/folders/create", request)

    async def delete_folder(self, ref: FolderRef) -> None:
        await self._call("POST", "/v1/folders/delete", ref)

    async def clone_folder(self, request: FolderClone) -> None:
        await self._call("POST", "/v1/folders/clone", request)

    async def usage(self, ref: FolderRef) -> FolderUsage:
        return await self._json(FolderUsage, "POST", "/v1/folders/usage", ref)

    async def set_quota(self, request: FolderQuota) -> None:
        await self._call("POST", "/v1/folders/quota", request)

    async def mount(self, ref: FolderRef) -> FolderMount:
        return await self._json(FolderMount, "POST", "/v1/folders/mount", ref)

    async def list_files(self, request: FileListRequest) -> FileListPage:
        return await self._json(FileListPage, "POST", "/v1/files/list", request)

    async def mkdir(self, request: MkdirRequest) -> None:
        await self._call("POST", "/v1/files/mkdir", request)

    async def move(self, request: MoveRequest) -> None:
        await self._call("POST", "/v1/files/move", request)

    async def delete_files(self, request: DeleteRequest) -> None:
        await self._call("POST", "/v1/files/delete", request)

    async def upload(self, request: UploadRequest) -> TransferTicket:
        return await self._json(TransferTicket, "POST", "/v1/files/upload", request)

    async def download(self, request: DownloadRequest) -> TransferTicket:
        return await self._json(TransferTicket, "POST", "/v1/files/download", request)


class StorageProxies:
    """The proxies named in the configuration store."""

    def __init__(
        self,
        store: ConfigStore,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._store = store
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout_s)

    async def close(self) -> None:
        await self._client.aclose()

    async def _read(self) -> tuple[dict[str, ProxyAddress], dict[str, str]]:
        """The usable proxies by name, and what is wrong with each half-configured one."""
        tree = await self._store.get_prefix(PROXIES_KEY)
        found: dict[str, ProxyAddress] = {}
        broken: dict[str, str] = {}
        for name, entry in sorted(tree.items()):
            where = f"{PROXIES_KEY}/{name}"
            if not isinstance(entry, Mapping):
                broken[name] = (
                    f"{where}: expected the keys manager_api, client_api and secret,"
                    f" received the value {entry!r}"
                )
                continue
            values: dict[str, str] = {}
            for key in ("manager_api", "client_api", "secret"):
                value = entry.get(key)
                if not isinstance(value, str) or not value:
                    broken[name] = (
                        f"{where}/{key}: expected a non-empty string, received {value!r}"
                        " (docs/storage.md, the configuration store keys)"
                    )
                    break
                values[key] = value
            else:
                if not values["manager_api"].startswith(("http://", "https://")):
                    broken[name] = (
                        f"{where}/manager_api: expected http://HOST:PORT,"
                        f" received {values['manager_api']!r}"
                    )
                    continue
                found[name] = ProxyAddress(
                    name, values["manager_api"], values["client_api"], values["secret"]
                )
        return found, broken

    async def addresses(self) -> dict[str, ProxyAddress]:
        """The usable proxies (a half-configured one is left out: docs/folders.md)."""
        return (await self._read())[0]

    async def default_host(self) -> str | None:
        return await self._store.get(DEFAULT_HOST_KEY)

    async def proxy(self, name: str, *, field: str = "host") -> StorageProxy:
        address = (await self.addresses()).get(name)
        if address is None:
            raise InvalidRequest(
                f"No storage proxy {name!r} is configured ({PROXIES_KEY}/{name}/...)",
                field=field,
                expected="a configured storage proxy",
                received=name,
            )
        return StorageProxy(address, self._client)

    async def for_host(self, host: str, *, field: str = "host") -> tuple[StorageProxy, str]:
        """The proxy of ``proxy:volume`` and the volume's name."""
        proxy_name, volume = split_host(host, field=field)
        return await self.proxy(proxy_name, field=field), volume

    async def all_hosts(self) -> dict[str, VolumeInfo]:
        """Every ``proxy:volume`` of the proxies that answer (one that does not is left out)."""
        hosts: dict[str, VolumeInfo] = {}
        for address in (await self.addresses()).values():
            try:
                volumes = await StorageProxy(address, self._client).volumes()
            except ManagerError:
                continue
            for volume in volumes:
                hosts[f"{address.name}:{volume.name}"] = volume
        return hosts

    async def _volumes_of(self, address: ProxyAddress) -> list[StorageVolume]:
        try:
            volumes = await StorageProxy(address, self._client).volumes()
        except StorageError as e:
            raise Unavailable(
                f"The storage proxy {address.name!r} at {address.manager_api} refused"
                f" GET /v1/volumes ({e.kind}): {e.detail}",
                proxy=address.name,
            ) from None
        return [StorageVolume(address.name, info) for info in volumes]

    async def volume_list(self) -> list[StorageVolume]:
        """Every volume of every proxy (asked at once), ordered by ``proxy:volume``.

        Strict, unlike :meth:`all_hosts`: a proxy that is half-configured, does not answer
        or refuses the secret is an error naming it (an admin's list that silently left
        out a proxy's volumes would look like lost data)."""
        found, broken = await self._read()
        if broken:
            name, why = next(iter(broken.items()))
            raise Unavailable(f"The storage proxy {name!r} is misconfigured: {why}", proxy=name)
        answers = await asyncio.gather(*(self._volumes_of(a) for a in found.values()))
        return sorted((v for volumes in answers for v in volumes), key=lambda v: v.id)

    async def find_volume(self, volume_id: str, *, field: str = "id") -> StorageVolume:
        """The volume ``<proxy>:<volume>``: a 400 for a malformed id, a 404 naming what
        exists when there is no such proxy or volume."""
        proxy_name, sep, volume_name = volume_id.partition(":")
        if not sep or not proxy_name or not volume_name:
            raise InvalidRequest(
                f"{field}: expected <proxy>:<volume> (e.g. local:volume1), received {volume_id!r}",
                field=field,
                expected="<proxy>:<volume>",
                received=volume_id,
            )
        found, _ = await self._read()
        address = found.get(proxy_name)
        if address is None:
            raise NotFound(
                f"{field}: no storage proxy {proxy_name!r}; the proxies are {sorted(found)}"
                f" (received {volume_id!r})"
            )
        volumes = await self._volumes_of(address)
        for volume in volumes:
            if volume.info.name == volume_name:
                return volume
        raise NotFound(
            f"{field}: the storage proxy {proxy_name!r} has no volume {volume_name!r};"
            f" its volumes are {sorted(v.id for v in volumes)}"
        )
