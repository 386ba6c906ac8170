"""The image catalogue service: add, list, alias and remove images; resolve a name.

Called by the admin routes (``/admin/images``), ``GET /images``, GraphQL ``images`` and
the session service at enqueue (:func:`lookup`, inside the enqueue transaction).  The
rules themselves (resolution, accelerator labels, minimum resources, placement) are
pure and live in :mod:`accelshare.sched.images`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from accelshare.common import ResourceSlot
from accelshare.sched.images import (
    RUNTIMES,
    ImageRequirement,
    close_names,
    is_valid_ref,
    resolve_image,
    split_ref,
    unknown_image,
)

from .db import Database
from .errors import Conflict, InvalidRequest, NotFound
from .models import Image, ImageAlias

__all__ = [
    "ImageService",
    "NewImage",
    "check_known_name",
    "image_json",
    "lookup",
    "requirement_of",
]


@dataclass(frozen=True, slots=True)
class NewImage:
    """A validated ``image add``: everything but ``min_slots`` is checked here; the
    caller parses ``min_slots`` against the known slot types."""

    ref: str
    runtime: str = "process"
    architecture: str = "x86_64"
    accelerators: tuple[str, ...] = ()
    min_slots: ResourceSlot = field(default_factory=ResourceSlot)
    description: str = ""
    labels: Mapping[str, Any] | None = None
    aliases: tuple[str, ...] = ()


def _check_name(value: str, field: str) -> None:
    if not is_valid_ref(value):
        raise InvalidRequest(
            f"{value!r} is not an image reference",
            field=field,
            expected="a reference such as python:3.11 or cr.example.org/lablup/pytorch:1.5",
            received=value,
        )


def requirement_of(image: Image) -> ImageRequirement:
    return ImageRequirement(
        ref=image.ref,
        runtime=image.runtime,
        architecture=image.architecture,
        accelerators=frozenset(image.accelerators or ()),
        min_slots=image.min_slots,
    )


def image_json(image: Image, aliases: Sequence[str]) -> dict[str, Any]:
    return {
        "ref": image.ref,
        "name": image.name,
        "tag": image.tag,
        "aliases": sorted(aliases),
        "architecture": image.architecture,
        "runtime": image.runtime,
        "accelerators": sorted(image.accelerators or ()),
        "labels": dict(image.labels or {}),
        "min_slots": image.min_slots.to_json(),
        "description": image.description,
        "created_at": image.created_at.isoformat() if image.created_at else None,
    }


async def _aliases(db: AsyncSession) -> dict[str, str]:
    rows = await db.execute(sa.select(ImageAlias.alias, ImageAlias.ref))
    return {str(alias): str(ref) for alias, ref in rows}


_ALIAS_TARGET = (
    sa.select(ImageAlias.ref).where(ImageAlias.alias == sa.bindparam("name")).scalar_subquery()
)
_LOOKUP = sa.select(Image, _ALIAS_TARGET).where(  # prebuilt: every create runs it
    sa.or_(Image.ref == sa.bindparam("name"), Image.ref == _ALIAS_TARGET)
)


async def lookup(db: AsyncSession, name: str) -> Image | None:
    """The catalogue image ``name`` (an alias or a reference) stands for, or ``None``."""
    # one query for the rows that can matter (the image spelled ``name`` and the one the
    # alias ``name`` points to, each with that alias's target), then the pure rule
    rows = (await db.execute(_LOOKUP, {"name": name})).all()
    found = {image.ref: image for image, _ in rows}
    alias_ref = next((ref for _, ref in rows if ref is not None), None)
    aliases = {name: alias_ref} if alias_ref is not None else {}
    ref = resolve_image(name, found.keys() & {name}, aliases)
    return None if ref is None else found.get(ref)


_CATALOGUE_NAMES = sa.union(sa.select(Image.ref), sa.select(ImageAlias.alias))


async def check_known_name(
    db: AsyncSession, name: str, *, scaling_group: str, reported: Set[str], pulls: bool
) -> None:
    """Refuse ``name`` (which :func:`lookup` did not find) when it is neither in the
    catalogue nor among the images the scaling group's agents report (``reported``),
    naming the close known names; ``pulls`` (a docker agent in the group) or nothing to
    judge by accepts it (:func:`accelshare.sched.images.unknown_image`)."""
    if pulls or name in reported:
        return  # no catalogue query
    catalogue = set((await db.execute(_CATALOGUE_NAMES)).scalars())
    if not unknown_image(name, catalogue=catalogue, reported=reported, pulls=pulls):
        return
    known = catalogue | reported
    close = close_names(name, known)
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else f"known images: {', '.join(sorted(known)[:10])}"
        + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    )
    raise InvalidRequest(
        f"Unknown image {name!r}: not in the image catalogue and no agent of scaling group"
        f" {scaling_group} reports it; {hint}",
        field="image",
        expected="an image of the catalogue (GET /images) or one an agent of scaling group"
        f" {scaling_group} reports" + (f" (close: {', '.join(close)})" if close else ""),
        received=name,
        closeNames=close,
    )


class ImageService:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def list(self) -> list[dict[str, Any]]:
        async with self.db.begin() as db:
            aliases = await _aliases(db)
            rows = (await db.execute(sa.select(Image).order_by(Image.name, Image.tag))).scalars()
            return [image_json(i, [a for a, ref in aliases.items() if ref == i.ref]) for i in rows]

    async def info(self, name: str) -> dict[str, Any]:
        async with self.db.begin() as db:
            image = await lookup(db, name)
            if image is None:
                raise NotFound(f"No image or alias {name!r}", field="image", received=name)
            aliases = await _aliases(db)
            return image_json(image, [a for a, ref in aliases.items() if ref == image.ref])

    async def add(self, new: NewImage) -> dict[str, Any]:
        _check_name(new.ref, "ref")
        if new.runtime not in RUNTIMES:
            raise InvalidRequest(
                f"Unknown runtime {new.runtime!r}",
                field="runtime",
                expected=" or ".join(RUNTIMES),
                received=new.runtime,
            )
        for alias in new.aliases:
            _check_name(alias, "aliases")
        name, tag = split_ref(new.ref)
        ref = f"{name}:{tag}"  # "python" is stored as "python:latest"
        async with self.db.begin(write=True) as db:
            if await db.get(Image, ref) is not None:
                raise Conflict(f"The image {ref} exists", field="ref", received=ref)
            image = Image(
                ref=ref,
                name=name,
                tag=tag,
                runtime=new.runtime,
                architecture=new.architecture,
                accelerators=sorted(set(new.accelerators)),
                labels=dict(new.labels or {}),
                min_slots=new.min_slots,
                description=new.description,
            )
            db.add(image)
            await db.flush()
            for alias in new.aliases:
                await self._set_alias(db, alias, ref)
        return await self.info(ref)

    async def alias(self, alias: str, target: str) -> dict[str, Any]:
        """Point ``alias`` at ``target`` (a reference or another alias); re-pointing an
        existing alias is allowed (``python`` moves from 3.10 to 3.11)."""
        _check_name(alias, "alias")
        async with self.db.begin(write=True) as db:
            image = await lookup(db, target)
            if image is None:
                raise NotFound(f"No image or alias {target!r}", field="target", received=target)
            await self._set_alias(db, alias, image.ref)
        return await self.info(alias)

    async def _set_alias(self, db: AsyncSession, alias: str, ref: str) -> None:
        if alias == ref:
            raise InvalidRequest(
                f"An alias cannot be the reference itself ({alias})",
                field="alias",
                expected="a different name",
                received=alias,
            )
        row = await db.get(ImageAlias, alias)
        if row is None:
            db.add(ImageAlias(alias=alias, ref=ref))
        else:
            row.ref = ref

    async def unalias(self, alias: str) -> None:
        async with self.db.begin(write=True) as db:
            row = await db.get(ImageAlias, alias)
            if row is None:
                raise NotFound(f"No alias {alias!r}", field="alias", received=alias)
            await db.delete(row)

    async def remove(self, name: str) -> str:
        """Remove an image (named by reference or alias) and its aliases; the removed
        reference.  Sessions that used it keep their image name."""
        async with self.db.begin(write=True) as db:
            image = await lookup(db, name)
            if image is None:
                raise NotFound(f"No image or alias {name!r}", field="image", received=name)
            await db.execute(sa.delete(ImageAlias).where(ImageAlias.ref == image.ref))
            await db.delete(image)
            return image.ref
