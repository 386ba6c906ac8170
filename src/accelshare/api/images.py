"""Image catalogue routes (docs/images.md).

| route | who | body | answer |
|---|---|---|---|
| ``GET /images`` | any user | | ``{"items": [image]}`` (aliases included) |
| ``GET /images/{name}`` | any user | | ``image`` (``name``: a reference or an alias) |
| ``POST /admin/images`` | superadmin | ``{ref, runtime?, architecture?, accelerators?, min_slots?, description?, labels?, aliases?}`` | 201 ``image`` |
| ``DELETE /admin/images/{name}`` | superadmin | | ``{"result": "deleted", "ref": ref}`` (its aliases go too) |
| ``PUT /admin/image-aliases/{alias}`` | superadmin | ``{target}`` | the image the alias now names |
| ``DELETE /admin/image-aliases/{alias}`` | superadmin | | ``{"result": "deleted"}`` |

An image is ``{ref, name, tag, aliases, architecture, runtime, accelerators, labels,
min_slots, description, created_at}``; ``min_slots`` amounts are user input
(``{"cpu": "2", "mem": "4g"}``) parsed against the known slot types.  References with a
``/`` (``cr.example.org/lablup/pytorch:1.5``) are passed URL-encoded (``%2F``) or as
the path's remainder.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from accelshare.manager.images import NewImage
from accelshare.manager.services.admin import parse_slots
from accelshare.sched.images import IMAGE_NAME_PATTERN

from .auth import CurrentIdentity, SuperadminIdentity
from .deps import UNFROZEN, ManagerDep
from .problems import InvalidAPIParameters

__all__ = ["router"]

router = APIRouter(tags=["images"])

_NAME = Field(min_length=1, max_length=256, pattern=IMAGE_NAME_PATTERN)
_DEVICE = r"^[a-z][a-z0-9_-]*$"


class ImageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ref: str = _NAME
    runtime: Literal["process", "docker"] = "process"
    architecture: str = Field(default="x86_64", min_length=1, max_length=32)
    accelerators: list[str] = Field(default_factory=list, max_length=32)
    min_slots: dict[str, Any] = Field(default_factory=dict)
    description: str = Field(default="", max_length=1024)
    labels: dict[str, Any] = Field(default_factory=dict)
    aliases: list[str] = Field(default_factory=list, max_length=32)


class AliasBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = _NAME


@router.get("/images")
async def list_images(_identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    return {"items": await manager.images.list()}


@router.get("/images/{name:path}")
async def image_info(name: str, _identity: CurrentIdentity, manager: ManagerDep) -> dict[str, Any]:
    return await manager.images.info(name)


@router.post("/admin/images", status_code=201, dependencies=[UNFROZEN])
async def add_image(
    body: ImageBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    for device in body.accelerators:
        if not re.match(_DEVICE, device):
            raise InvalidAPIParameters(
                f"{device!r} is not an accelerator device name",
                field="accelerators",
                expected="a device name such as cuda or rocm",
                received=device,
            )
    known = await manager.known_slots.load()
    min_slots = parse_slots(body.min_slots, known, "min_slots")
    return await manager.images.add(
        NewImage(
            ref=body.ref,
            runtime=body.runtime,
            architecture=body.architecture,
            accelerators=tuple(body.accelerators),
            min_slots=min_slots,
            description=body.description,
            labels=body.labels,
            aliases=tuple(body.aliases),
        )
    )


@router.delete("/admin/images/{name:path}", dependencies=[UNFROZEN])
async def remove_image(
    name: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    ref = await manager.images.remove(name)
    return {"result": "deleted", "ref": ref}


@router.put("/admin/image-aliases/{alias:path}", dependencies=[UNFROZEN])
async def set_alias(
    alias: str, body: AliasBody, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, Any]:
    return await manager.images.alias(alias, body.target)


@router.delete("/admin/image-aliases/{alias:path}", dependencies=[UNFROZEN])
async def remove_alias(
    alias: str, _identity: SuperadminIdentity, manager: ManagerDep
) -> dict[str, str]:
    await manager.images.unalias(alias)
    return {"result": "deleted"}
