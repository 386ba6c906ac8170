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

from .errors import InvalidRequest, ManagerError, Unavailable

__all__ = [
    "DEFAULT_HOST_KEY",
    "PROXIES_KEY",
    "ProxyAddress",
    "StorageError",
    "StorageProxies",
    "StorageProxy",
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
                f"The storage proxy {self.name!r} cannot be reached at"
                f" {self.address.manager_api}: {e or type(e).__name__}",
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

    async def addresses(self) -> dict[str, ProxyAddress]:
        tree = await self._store.get_prefix(PROXIES_KEY)
        found: dict[str, ProxyAddress] = {}
        for name, entry in sorted(tree.items()):
            if not isinstance(entry, Mapping):
                continue
            manager_api = entry.get("manager_api")
            client_api = entry.get("client_api")
            secret = entry.get("secret")
            if not all(isinstance(v, str) and v for v in (manager_api, client_api, secret)):
                continue  # half-configured: not usable (docs/folders.md lists the keys)
            found[name] = ProxyAddress(name, str(manager_api), str(client_api), str(secret))
        return found

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
