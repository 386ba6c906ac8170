"""The image catalogue: images and their aliases (see docs/images.md).

An image is identified by its reference ``name:tag`` (``python:3.11``,
``cr.example.org/lablup/pytorch:1.5``).  For the docker runtime the reference is what
the engine pulls and runs; for the process runtime it is the name of an environment
configured on the agents (``[container.environments."python:3.11"]``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from accelshare.common import ResourceSlot
from accelshare.manager.clock import utcnow

from .base import Base, JSONDocument, ResourceSlotJSON, UTCDateTime

__all__ = ["Image", "ImageAlias"]


class Image(Base):
    __tablename__ = "images"

    ref: Mapped[str] = mapped_column(sa.String(256), primary_key=True)  # "python:3.11"
    name: Mapped[str] = mapped_column(sa.String(256))  # "python"
    tag: Mapped[str] = mapped_column(sa.String(128))  # "3.11"
    architecture: Mapped[str] = mapped_column(sa.String(32), default="x86_64")
    runtime: Mapped[str] = mapped_column(sa.String(16), default="process")  # process | docker
    # device names of the accelerator plugins the image supports, e.g. ["cuda"]
    accelerators: Mapped[list[str]] = mapped_column(JSONDocument, default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(JSONDocument, default=dict)
    min_slots: Mapped[ResourceSlot] = mapped_column(ResourceSlotJSON(), default=ResourceSlot)
    description: Mapped[str] = mapped_column(sa.String(1024), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ImageAlias(Base):
    __tablename__ = "image_aliases"

    alias: Mapped[str] = mapped_column(sa.String(256), primary_key=True)  # "python"
    ref: Mapped[str] = mapped_column(sa.ForeignKey("images.ref", ondelete="CASCADE"), index=True)
