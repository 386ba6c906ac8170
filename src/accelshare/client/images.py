"""``client.images``: the image catalogue (docs/images.md).

Every user lists and inspects images (``list``, ``info`` by reference or alias); a
superadmin adds, aliases and removes them.  Answers are :class:`ImageInfo`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from .http import HttpCaller
from .models import ImageInfo

__all__ = ["ImagesAPI"]


class ImagesAPI:
    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    async def list(self) -> list[ImageInfo]:
        answer = await self._http.request("GET", "/images")
        return [ImageInfo.model_validate(i) for i in answer.get("items", [])]

    async def info(self, name: str) -> ImageInfo:
        """``name``: a reference (``python:3.11``) or an alias (``python``)."""
        return ImageInfo.model_validate(await self._http.request("GET", f"/images/{quote(name)}"))

    async def add(
        self,
        ref: str,
        *,
        runtime: str = "process",
        architecture: str = "x86_64",
        accelerators: Sequence[str] = (),
        min_slots: Mapping[str, str] | None = None,
        description: str = "",
        labels: Mapping[str, Any] | None = None,
        aliases: Sequence[str] = (),
    ) -> ImageInfo:
        body = {
            "ref": ref,
            "runtime": runtime,
            "architecture": architecture,
            "accelerators": list(accelerators),
            "min_slots": dict(min_slots or {}),
            "description": description,
            "labels": dict(labels or {}),
            "aliases": list(aliases),
        }
        return ImageInfo.model_validate(
            await self._http.request("POST", "/admin/images", json_body=body)
        )

    async def alias(self, alias: str, target: str) -> ImageInfo:
        """Point ``alias`` at ``target`` (a reference or alias); answers the image."""
        path = f"/admin/image-aliases/{quote(alias)}"
        answer = await self._http.request("PUT", path, json_body={"target": target})
        return ImageInfo.model_validate(answer)

    async def unalias(self, alias: str) -> None:
        await self._http.request("DELETE", f"/admin/image-aliases/{quote(alias)}")

    async def remove(self, name: str) -> str:
        """Remove an image (by reference or alias) and its aliases; the reference removed."""
        answer = await self._http.request("DELETE", f"/admin/images/{quote(name)}")
        return str(answer["ref"])
