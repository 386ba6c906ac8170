"""Image aliases in Backend.AI's admin GraphQL (superadmin; the ``images`` and ``image``
queries are in :mod:`accelshare.api.gql`):

* ``alias_image(alias, target, architecture) { ok msg }`` — the catalogue alias
  (``accelshare admin image alias``); re-pointing an existing alias is allowed;
* ``dealias_image(alias) { ok msg }``;
* ``rescan_images``: refused with an error that says what to use instead — accelshare
  does not scan registries; images are registered in its catalogue.
"""

from __future__ import annotations

import strawberry
from strawberry.types import Info

from .common import refuse, superadmin_manager

__all__ = ["ImageMutation"]


@strawberry.type(name="AliasImage")
class ImageAliasResult:
    ok: bool
    msg: str


@strawberry.type(name="RescanImages")
class RescanImages:
    ok: bool
    msg: str
    task_id: str | None


@strawberry.type
class ImageMutation:
    @strawberry.mutation
    async def alias_image(
        self, info: Info, alias: str, target: str, architecture: str | None = None
    ) -> ImageAliasResult:
        manager = superadmin_manager(info)
        if architecture is not None:
            image = await manager.images.info(target)
            if image["architecture"] != architecture:
                raise ValueError(
                    f"architecture: {target} is an image for {image['architecture']},"
                    f" received {architecture!r} (an alias names one image)"
                )
        image = await manager.images.alias(alias, target)
        return ImageAliasResult(ok=True, msg=f"{alias} names {image['ref']}")

    @strawberry.mutation
    async def dealias_image(self, info: Info, alias: str) -> ImageAliasResult:
        manager = superadmin_manager(info)
        await manager.images.unalias(alias)
        return ImageAliasResult(ok=True, msg=f"the alias {alias} is removed")

    @strawberry.mutation
    async def rescan_images(
        self, info: Info, registry: str | None = None, project: str | None = None
    ) -> RescanImages:
        superadmin_manager(info)
        raise refuse(
            "image rescans",
            "accelshare does not scan container registries: images are registered in its"
            " catalogue with `accelshare admin image add REF` (docs/images.md)",
        )
