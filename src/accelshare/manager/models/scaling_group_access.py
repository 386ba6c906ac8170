"""Who may use which scaling group (Backend.AI's ``sgroups_for_*`` tables).

A session may go to a scaling group associated with its owner's domain, with the
project (group) it is charged to, or with its owner's keypair, when that scaling group
is active (:mod:`accelshare.manager.services.scaling_group_access`).  A row is deleted
with its scaling group, domain, group or keypair.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base
from .identity import ACCESS_KEY_LENGTH

__all__ = ["ScalingGroupForDomain", "ScalingGroupForGroup", "ScalingGroupForKeypair"]

_SCALING_GROUP = "scaling_groups.name"


class ScalingGroupForDomain(Base):
    __tablename__ = "sgroups_for_domains"

    scaling_group: Mapped[str] = mapped_column(
        sa.ForeignKey(_SCALING_GROUP, ondelete="CASCADE"), primary_key=True
    )
    domain: Mapped[str] = mapped_column(
        sa.ForeignKey("domains.name", ondelete="CASCADE"), primary_key=True, index=True
    )


class ScalingGroupForGroup(Base):
    __tablename__ = "sgroups_for_groups"

    scaling_group: Mapped[str] = mapped_column(
        sa.ForeignKey(_SCALING_GROUP, ondelete="CASCADE"), primary_key=True
    )
    group: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class ScalingGroupForKeypair(Base):
    __tablename__ = "sgroups_for_keypairs"

    scaling_group: Mapped[str] = mapped_column(
        sa.ForeignKey(_SCALING_GROUP, ondelete="CASCADE"), primary_key=True
    )
    access_key: Mapped[str] = mapped_column(
        sa.String(ACCESS_KEY_LENGTH),
        sa.ForeignKey("keypairs.access_key", ondelete="CASCADE"),
        primary_key=True,
        index=True,
    )
