"""Folder names, paths inside a folder, and the folders a session's create request asks
to mount (pure checks, no store).

Names follow Backend.AI's rules: 1 to 64 characters, no ``/``, no NUL or control
character, not starting with ``.``, unique per owner (the trash included; the store
checks that part).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accelshare.common import CommonValueError
from accelshare.common.text_input import check_text

from ...errors import InvalidRequest

__all__ = [
    "KERNEL_HOME",
    "MAX_FOLDER_NAME",
    "MountRequest",
    "check_folder_name",
    "check_kernel_path",
    "check_rel_path",
    "parse_mount_specs",
]

MAX_FOLDER_NAME = 64
KERNEL_HOME = "/home/work"


@dataclass(frozen=True)
class MountRequest:
    """One folder a session asks for: ``name``, optionally where and read-only."""

    name: str
    kernel_path: str | None = None
    read_only: bool = False


def check_folder_name(name: Any, *, field: str = "name") -> str:
    """Backend.AI's folder name rules (see the module doc); a 400 naming ``field``."""
    expected = (
        f"1 to {MAX_FOLDER_NAME} characters, no '/', no control character, not starting with '.'"
    )
    if not isinstance(name, str) or not name or len(name) > MAX_FOLDER_NAME:
        raise InvalidRequest(
            f"A folder name has {expected} (received {name!r})",
            field=field,
            expected=expected,
            received=name,
        )
    try:
        check_text(name, field=field)
    except CommonValueError as e:
        raise InvalidRequest(str(e), field=field, expected=expected, received=name) from None
    if "/" in name or name.startswith(".") or name != name.strip():
        raise InvalidRequest(
            f"The folder name {name!r} is not allowed: {expected}, no surrounding spaces",
            field=field,
            expected=expected,
            received=name,
        )
    return name


def check_rel_path(path: Any, *, field: str) -> str:
    """A path inside a folder as given by a client (the proxy checks it again)."""
    if not isinstance(path, str) or not path:
        raise InvalidRequest(
            f"{field} must be a path inside the folder",
            field=field,
            expected="a relative path",
            received=path,
        )
    try:
        check_text(path, field=field)
    except CommonValueError as e:
        raise InvalidRequest(
            str(e), field=field, expected="a relative path", received=path
        ) from None
    return path


def parse_mount_specs(
    mounts: Sequence[str] | None,
    mount_map: Mapping[str, str] | None,
    mount_options: Mapping[str, Any] | None = None,
) -> list[MountRequest]:
    """A create request's ``mounts`` (``name``, ``name:/path``, ``name:/path:ro``,
    ``name:ro``), ``mount_map`` (``name -> path``; a ``:ro`` suffix allowed) and
    ``mount_options`` (``name -> {"permission": "ro"}``, the official client's ``perm=ro``)
    as one list.

    >>> parse_mount_specs(["data", "models:/opt/models:ro"], {"data": "/data"})
    [MountRequest(name='data', kernel_path='/data', read_only=False), MountRequest(name='models', kernel_path='/opt/models', read_only=True)]
    """
    found: dict[str, MountRequest] = {}
    for index, spec in enumerate(mounts or []):
        field = f"mounts[{index}]"
        if not isinstance(spec, str) or not spec:
            raise InvalidRequest(
                f"A mount is name[:/path][:ro] (received {spec!r})",
                field=field,
                expected="name[:/path][:ro]",
                received=spec,
            )
        name, path, read_only = _split_mount(spec, field)
        found[name] = MountRequest(name, path, read_only)
    for name, target in (mount_map or {}).items():
        check_folder_name(name, field=f"mount_map.{name}")
        path, read_only = target, False
        if isinstance(target, str) and target.endswith(":ro"):
            path, read_only = target[: -len(":ro")], True
        previous = found.get(name)
        found[name] = MountRequest(
            name,
            check_kernel_path(path, field=f"mount_map.{name}"),
            read_only or (previous.read_only if previous else False),
        )
    for name, options in (mount_options or {}).items():
        if name not in found or not isinstance(options, Mapping):
            continue
        permission = options.get("permission") or options.get("perm")
        if permission in ("ro", "read-only", "READ_ONLY") or options.get("readonly") in (
            True,
            "true",
            "1",
        ):
            found[name] = MountRequest(name, found[name].kernel_path, True)
    return list(found.values())


def _split_mount(spec: str, field: str) -> tuple[str, str | None, bool]:
    parts = spec.split(":")
    read_only = False
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    if len(parts) > 2:
        raise InvalidRequest(
            f"A mount is name[:/path][:ro] (received {spec!r})",
            field=field,
            expected="name[:/path][:ro]",
            received=spec,
        )
    name = check_folder_name(parts[0], field=field)
    path = check_kernel_path(parts[1], field=field) if len(parts) == 2 else None
    return name, path, read_only


def check_kernel_path(path: Any, *, field: str) -> str:
    expected = "an absolute path without '..' (or a name under /home/work)"
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidRequest(
            f"A mount path is {expected} (received {path!r})",
            field=field,
            expected=expected,
            received=path,
        )
    if not path.startswith("/"):
        path = f"{KERNEL_HOME}/{path}"
    if ".." in path.split("/") or path.rstrip("/") in ("", KERNEL_HOME):
        raise InvalidRequest(
            f"A mount path is {expected} (received {path!r})",
            field=field,
            expected=expected,
            received=path,
        )
    return str(path).rstrip("/")
