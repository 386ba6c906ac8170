"""Storage folders: Backend.AI's ``/folders`` routes, as the official client 25.5 calls them.

A folder in a path is its id (32 hex digits, what the client sends once it asked
``/folders/_/id``) or its name.  Several routes carry a JSON body on ``GET`` and
``DELETE`` (the client's way); bodies are read leniently: a missing body is ``{}``.

| route | body | answer |
|---|---|---|
| ``POST /folders`` | ``{name, host?, group?, usage_mode?, permission?, cloneable?}`` | 201 folder |
| ``GET /folders`` | ``{all?}``, ``?group_id=`` | ``[folder]`` (own, project, shared) |
| ``DELETE /folders`` | ``{id}`` | 204; the folder goes to the trash |
| ``GET /folders/_/hosts``, ``/_/all_hosts`` | | ``{default, allowed, volume_info}`` |
| ``GET /folders/_/allowed_types`` | | ``["user", "group"]`` |
| ``GET /folders/_/id`` | ``{name}`` | ``{id, name}`` |
| ``POST /folders/purge``, ``/delete-from-trash-bin`` | ``{id}`` | 204, purged |
| ``POST /folders/restore-from-trash-bin`` | ``{id}`` | 204 |
| ``GET /folders/{f}`` | | info with ``numFiles``, ``used_bytes`` |
| ``POST /folders/{f}/rename`` | ``{new_name}`` | 204 |
| ``POST /folders/{f}/request-upload`` | ``{path, size}`` | ``{token, url}`` (tus on the proxy) |
| ``POST /folders/{f}/request-download`` | ``{path, archive?}`` | ``{token, url}`` |
| ``POST /folders/{f}/mkdir`` | ``{path, parents?, exist_ok?}`` | 201 ``{results: {success, failed}}`` |
| ``GET /folders/{f}/files?path=`` | | ``{items, files}`` |
| ``POST /folders/{f}/rename-file`` | ``{target_path, new_name}`` | ``{}`` |
| ``POST /folders/{f}/move-file`` | ``{src, dst}`` | ``{}`` |
| ``DELETE /folders/{f}/delete-files`` | ``{files, recursive?}`` | 204 |
| ``POST /folders/{f}/invite`` | ``{perm, user_ids: [email]}`` | 201 ``{invited_ids}`` |
| ``GET /folders/invitations/list`` | | ``{invitations}`` |
| ``POST /folders/invitations/accept`` | ``{inv_id}`` | ``{msg}`` |
| ``DELETE /folders/invitations/delete`` | ``{inv_id}`` | ``{msg}`` |
| ``POST /folders/{f}/share`` | ``{permission, emails}`` | 201 ``{shared_emails}`` |
| ``DELETE /folders/{f}/unshare`` | ``{emails}`` | ``{unshared_emails}`` |
| ``POST /folders/{f}/leave`` | ``{shared_user_uuid?}`` | ``{msg}`` |
| ``POST /folders/{f}/clone`` | ``{target_name, target_host?, usage_mode?, permission?}`` | 201 folder |
| ``POST /folders/{f}/update-options`` | ``{permission?, cloneable?}`` (null: unchanged) | 201 ``{id, name, permission, cloneable}`` |
| ``GET /folders/_/shared`` | ``?vfolder_id=`` | ``{shared: [{vfolder_id, vfolder_name, status, owner, type, shared_to: {uuid, email}, perm}]}`` |
| ``POST /folders/_/shared`` | ``{vfolder, user, perm}`` (``perm`` null: removed) | ``{msg}`` |
| ``POST /folders/_/change-ownership`` | ``{vfolder, user_email}`` (superadmin) | ``{id, name, user, user_email}`` |

Everything else under ``/folders`` (``_/sharing``, ``_/fstab``, ``_/mounts``,
``_/perf-metric``, quota routes) answers 501 naming the route.  See docs/folders.md.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request

from accelshare.manager.enums import VFolderOwnershipType, VFolderPermission, VFolderUsageMode
from accelshare.manager.services.folders.crud import NewFolder

from .auth import CurrentIdentity, SuperadminIdentity
from .compat import NotSupported
from .deps import UNFROZEN, ManagerDep
from .problems import InvalidAPIParameters

__all__ = ["router"]

router = APIRouter(prefix="/folders", tags=["folders"])

_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise InvalidAPIParameters(
            f"The body is not JSON: {e}", field="body", expected="a JSON object", received=raw[:80]
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidAPIParameters(
            "The body must be a JSON object", field="body", expected="a JSON object", received=data
        )
    return data


def _str(body: dict[str, Any], key: str, *, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value:
        raise InvalidAPIParameters(
            f"{key} is required (text)", field=key, expected="a non-empty string", received=value
        )
    return value


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidAPIParameters(
            f"{key} must be text", field=key, expected="a string or null", received=value
        )
    return value


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidAPIParameters(
        f"{key} must be true or false", field=key, expected="a boolean", received=value
    )


def _opt_bool(body: dict[str, Any], key: str) -> bool | None:
    """A boolean, or ``None`` when missing or null."""
    value = body.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise InvalidAPIParameters(
        f"{key} must be true, false or null (received {value!r})",
        field=key,
        expected="true, false or null",
        received=value,
    )


def _parse_perm(value: Any, key: str, *, nullable: bool = False) -> VFolderPermission:
    try:
        return VFolderPermission(value)
    except ValueError:
        expected = "ro, rw, wd or null" if nullable else "ro, rw or wd"
        raise InvalidAPIParameters(
            f"{key} is one of {expected} (received {value!r})",
            field=key,
            expected=expected,
            received=value,
        ) from None


def _perm(body: dict[str, Any], key: str, default: str = "rw") -> VFolderPermission:
    return _parse_perm(body.get(key) or default, key)


def _opt_perm(body: dict[str, Any], key: str) -> VFolderPermission | None:
    """A permission, or ``None`` when missing or null."""
    value = body.get(key)
    return None if value is None else _parse_perm(value, key, nullable=True)


def _uuid(body: dict[str, Any], key: str, what: str) -> uuid.UUID:
    value = body.get(key)
    try:
        if not isinstance(value, str):
            raise ValueError
        return uuid.UUID(value)
    except ValueError:
        raise InvalidAPIParameters(
            f"{key} is {what}'s id (received {value!r})",
            field=key,
            expected="a UUID (32 hexadecimal digits, dashes optional)",
            received=value,
        ) from None


def _usage_mode(body: dict[str, Any], key: str = "usage_mode") -> VFolderUsageMode:
    value = body.get(key) or "general"
    try:
        return VFolderUsageMode(value)
    except ValueError:
        raise InvalidAPIParameters(
            f"{key} is one of general, model, data (received {value!r})",
            field=key,
            expected="general, model or data",
            received=value,
        ) from None


def _str_list(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidAPIParameters(
            f"{key} is a list of text",
            field=key,
            expected="a non-empty list of strings",
            received=value,
        )
    return value


# -- folders ---------------------------------------------------------------------------------


@router.post("", status_code=201, dependencies=[UNFROZEN])
async def create_folder(
    request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    spec = NewFolder(
        name=_str(body, "name"),
        host=_opt_str(body, "host") or _opt_str(body, "folder_host"),
        group=_opt_str(body, "group") or _opt_str(body, "group_id"),
        usage_mode=_usage_mode(body),
        permission=_perm(body, "permission"),
        cloneable=_bool(body, "cloneable"),
        unmanaged_path=_opt_str(body, "unmanaged_path"),
    )
    return await manager.folders.create(identity, spec)


@router.get("")
async def list_folders(
    request: Request,
    identity: CurrentIdentity,
    manager: ManagerDep,
    group_id: uuid.UUID | None = None,
    all: bool = False,
) -> list[dict[str, Any]]:
    body = await _body(request)
    return await manager.folders.list_folders(
        identity, all_=_bool(body, "all", all), group_id=group_id
    )


@router.delete("", status_code=204, dependencies=[UNFROZEN])
async def delete_folder(request: Request, identity: CurrentIdentity, manager: ManagerDep) -> None:
    body = await _body(request)
    await manager.folders.delete(identity, _str(body, "id", default=body.get("vfolder_id")))


@router.get("/_/hosts")
async def list_hosts(identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    return await manager.folders.list_hosts(identity)


@router.get("/_/all_hosts")
async def list_all_hosts(identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    hosts = await manager.folders.list_hosts(identity)
    return {"default": hosts["default"], "allowed": hosts["allowed"]}


@router.get("/_/allowed_types")
async def allowed_types(_identity: CurrentIdentity) -> list[str]:
    return [t.value for t in VFolderOwnershipType]  # user folders, project (group) folders


@router.get("/_/id")
async def folder_id(
    request: Request, identity: CurrentIdentity, manager: ManagerDep, name: str | None = None
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.get_id(identity, _str(body, "name", default=name))


@router.post("/purge", status_code=204, dependencies=[UNFROZEN])
@router.post("/delete-from-trash-bin", status_code=204, dependencies=[UNFROZEN])
async def purge(request: Request, identity: CurrentIdentity, manager: ManagerDep) -> None:
    body = await _body(request)
    await manager.folders.purge(identity, _str(body, "id", default=body.get("vfolder_id")))


@router.post("/restore-from-trash-bin", status_code=204, dependencies=[UNFROZEN])
async def restore(request: Request, identity: CurrentIdentity, manager: ManagerDep) -> None:
    body = await _body(request)
    await manager.folders.restore(identity, _str(body, "id", default=body.get("vfolder_id")))


# -- invitations -----------------------------------------------------------------------------


@router.get("/invitations/list")
async def invitations(identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    return await manager.folders.invitations(identity)


@router.post("/invitations/accept", dependencies=[UNFROZEN])
async def accept(
    request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.accept_invitation(identity, _str(body, "inv_id"))


@router.delete("/invitations/delete", dependencies=[UNFROZEN])
async def reject(
    request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.delete_invitation(identity, _str(body, "inv_id"))


# -- shares across folders, owners -----------------------------------------------------------


@router.get("/_/shared")
async def list_shares(
    identity: CurrentIdentity, manager: ManagerDep, vfolder_id: str | None = None
) -> dict[str, Any]:
    return await manager.folders.list_shares(identity, vfolder_id or None)


@router.post("/_/shared", dependencies=[UNFROZEN])
async def update_share(
    request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    key = next((k for k in ("perm", "permission") if k in body), None)
    if key is None:
        raise InvalidAPIParameters(
            "perm is required: the share's new permission, or null to remove the share",
            field="perm",
            expected="ro, rw, wd or null",
            received=None,
        )
    return await manager.folders.update_share(
        identity,
        _uuid(body, "vfolder", "a folder"),
        _uuid(body, "user", "a user"),
        _opt_perm(body, key),
    )


@router.post("/_/change-ownership", dependencies=[UNFROZEN])
async def change_ownership(
    request: Request, identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.change_owner(
        identity, _uuid(body, "vfolder", "a folder"), _str(body, "user_email")
    )


# what accelshare does not build: named 501s before the ``/{name}`` routes catch them
_NOT_BUILT = {
    "_/sharing": "changing several shares of a folder at once (use `/folders/_/shared`)",
    "_/fstab": "the hosts' fstab (`admin vfolder get-fstab-contents`)",
    "_/mounts": "mounting hosts' file systems (`admin vfolder mount-host`)",
    "_/perf-metric": "volume performance metrics",
    "_/quota": "per-folder quota changes (the keypair resource policy sets the size limit)",
    "_/usage": "admin usage queries (use `vfolder info`)",
    "_/used-bytes": "admin usage queries (use `vfolder info`)",
    "_/sent-invitations": "the list of sent invitations",
}


def _not_built(path: str, what: str) -> None:
    async def handler(_identity: CurrentIdentity) -> None:
        raise NotSupported(
            f"accelshare does not support {what} (/folders/{path}); see docs/compatibility.md",
            feature="vfolder",
        )

    router.add_api_route(f"/{path}", handler, methods=_ANY_METHOD, include_in_schema=False)


for _path, _what in _NOT_BUILT.items():
    _not_built(_path, _what)


# -- one folder ------------------------------------------------------------------------------


@router.get("/{name}")
async def info(name: str, identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    return await manager.folders.info(identity, name)


@router.post("/{name}/rename", status_code=204, dependencies=[UNFROZEN])
async def rename(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> None:
    body = await _body(request)
    await manager.folders.rename(identity, name, _str(body, "new_name"))


@router.post("/{name}/update-options", status_code=201, dependencies=[UNFROZEN])
async def update_options(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.update_options(
        identity,
        name,
        permission=_opt_perm(body, "permission"),
        cloneable=_opt_bool(body, "cloneable"),
    )


@router.post("/{name}/request-upload")
async def request_upload(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.request_upload(
        identity,
        name,
        _str(body, "path"),
        body.get("size"),  # type: ignore[arg-type]
    )


@router.post("/{name}/request-download")
async def request_download(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.request_download(
        identity, name, _str(body, "path"), archive=_bool(body, "archive")
    )


@router.post("/{name}/mkdir", status_code=201)
async def mkdir(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    paths = body.get("path")
    if isinstance(paths, list):
        paths = [str(p) if isinstance(p, str) else p for p in paths]
    return await manager.folders.mkdir(
        identity,
        name,
        paths,  # type: ignore[arg-type]  # checked by the service
        parents=_bool(body, "parents"),
        exist_ok=_bool(body, "exist_ok"),
    )


@router.get("/{name}/files")
async def list_files(
    name: str, identity: CurrentIdentity, manager: ManagerDep, path: str = "."
) -> dict[str, Any]:
    return await manager.folders.list_files(identity, name, path)


@router.post("/{name}/rename-file")
async def rename_file(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    await manager.folders.rename_file(
        identity, name, _str(body, "target_path"), _str(body, "new_name")
    )
    return {}


@router.post("/{name}/move-file")
async def move_file(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    await manager.folders.move_file(identity, name, _str(body, "src"), _str(body, "dst"))
    return {}


@router.delete("/{name}/delete-files", status_code=204)
async def delete_files(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> None:
    body = await _body(request)
    await manager.folders.delete_files(
        identity, name, _str_list(body, "files"), recursive=_bool(body, "recursive")
    )


@router.post("/{name}/invite", status_code=201, dependencies=[UNFROZEN])
async def invite(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    emails = _str_list(body, "user_ids" if "user_ids" in body else "emails")
    return await manager.folders.invite(identity, name, _perm(body, "perm"), emails)


@router.post("/{name}/share", status_code=201, dependencies=[UNFROZEN])
async def share(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.share(
        identity, name, _perm(body, "permission"), _str_list(body, "emails")
    )


@router.delete("/{name}/unshare", dependencies=[UNFROZEN])
async def unshare(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.unshare(identity, name, _str_list(body, "emails"))


@router.post("/{name}/leave", dependencies=[UNFROZEN])
async def leave(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.leave(identity, name, _opt_str(body, "shared_user_uuid"))


@router.post("/{name}/clone", status_code=201, dependencies=[UNFROZEN])
async def clone(
    name: str, request: Request, identity: CurrentIdentity, manager: ManagerDep
) -> dict[str, Any]:
    body = await _body(request)
    return await manager.folders.clone(
        identity,
        name,
        target_name=_str(body, "target_name"),
        target_host=_opt_str(body, "target_host"),
        usage_mode=_usage_mode(body),
        permission=_perm(body, "permission"),
    )


@router.api_route("/{name}/{rest:path}", methods=_ANY_METHOD, include_in_schema=False)
async def not_built(name: str, rest: str, _identity: CurrentIdentity) -> None:
    raise NotSupported(
        f"accelshare does not support /folders/{{folder}}/{rest}; see docs/compatibility.md",
        feature="vfolder",
    )
