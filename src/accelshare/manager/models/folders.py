"""Storage folders (Backend.AI's virtual folders, "vfolders"), their shares and
invitations, and which folders each session mounts.

A folder lives on a *host* ``<proxy>:<volume>`` (a storage proxy named in the
configuration store and one of its volumes); the proxy keeps its bytes under the
folder's id, the manager keeps everything else here.

* a folder is owned by a user (``ownership_type`` ``user``, ``user_id`` set) or by a
  project (``group``, ``group_id`` set) — never both (``ck_vfolders_one_owner``);
* its name is unique per owner, trash included (``uq_vfolders_user_id_name``,
  ``uq_vfolders_group_id_name``; NULLs never collide, so each covers one kind);
* ``status`` follows Backend.AI's ``VFolderOperationStatus`` (``ready``,
  ``delete-pending`` = in the trash, ``delete-ongoing`` = being purged...);
  ``status_changed_at`` dates the move to the trash (the purge of old trash reads it);
* :class:`VFolderPermissionGrant` (``vfolder_permissions``): a user folder shared with
  another user (an accepted invitation) or a project folder's per-user override;
* :class:`VFolderInvitation`: pending / accepted / rejected / canceled;
* :class:`SessionVFolderMount`: the folders a session mounts (a folder mounted by a
  session that has not ended cannot be deleted).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from accelshare.manager.clock import utcnow
from accelshare.manager.enums import (
    InvitationState,
    VFolderOwnershipType,
    VFolderPermission,
    VFolderStatus,
    VFolderUsageMode,
)

from .base import Base, UTCDateTime, str_enum

__all__ = [
    "InvitationState",
    "SessionVFolderMount",
    "VFolder",
    "VFolderInvitation",
    "VFolderOwnershipType",
    "VFolderPermission",
    "VFolderPermissionGrant",
    "VFolderStatus",
    "VFolderUsageMode",
]


class VFolder(Base):
    __tablename__ = "vfolders"
    __table_args__ = (
        sa.UniqueConstraint("user_id", "name"),
        sa.UniqueConstraint("group_id", "name"),
        sa.CheckConstraint(
            "(user_id IS NULL) <> (group_id IS NULL)",
            name="one_owner",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(sa.String(64))
    host: Mapped[str] = mapped_column(sa.String(128))  # "<proxy>:<volume>"
    domain_name: Mapped[str] = mapped_column(sa.ForeignKey("domains.name"), index=True)
    ownership_type: Mapped[VFolderOwnershipType] = mapped_column(str_enum(VFolderOwnershipType, 16))
    user_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    group_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.ForeignKey("groups.id", ondelete="CASCADE"), index=True
    )
    creator: Mapped[str] = mapped_column(sa.String(128))  # the creator's e-mail
    permission: Mapped[VFolderPermission] = mapped_column(
        str_enum(VFolderPermission, 8), default=VFolderPermission.READ_WRITE
    )
    usage_mode: Mapped[VFolderUsageMode] = mapped_column(
        str_enum(VFolderUsageMode, 16), default=VFolderUsageMode.GENERAL
    )
    cloneable: Mapped[bool] = mapped_column(default=False)
    status: Mapped[VFolderStatus] = mapped_column(
        str_enum(VFolderStatus, 32), default=VFolderStatus.READY, index=True
    )
    quota_bytes: Mapped[int | None] = mapped_column(sa.BigInteger())  # NULL: no limit
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used: Mapped[datetime | None] = mapped_column(UTCDateTime())
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class VFolderPermissionGrant(Base):
    """A folder shared with a user (``vfolder_permissions``)."""

    __tablename__ = "vfolder_permissions"

    vfolder_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    permission: Mapped[VFolderPermission] = mapped_column(str_enum(VFolderPermission, 8))


class VFolderInvitation(Base):
    __tablename__ = "vfolder_invitations"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    vfolder_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("vfolders.id", ondelete="CASCADE"), index=True
    )
    inviter: Mapped[str] = mapped_column(sa.String(128))  # e-mail
    invitee: Mapped[str] = mapped_column(sa.String(128), index=True)  # e-mail
    permission: Mapped[VFolderPermission] = mapped_column(str_enum(VFolderPermission, 8))
    state: Mapped[InvitationState] = mapped_column(
        str_enum(InvitationState, 16), default=InvitationState.PENDING
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class SessionVFolderMount(Base):
    """A folder mounted into a session (``kernel_path`` inside its kernels)."""

    __tablename__ = "session_vfolder_mounts"

    session_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True
    )
    vfolder_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    kernel_path: Mapped[str] = mapped_column(sa.String(1024))
    read_only: Mapped[bool] = mapped_column(default=False)
