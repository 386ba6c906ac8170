"""Who may do what: domains, groups (projects), users, keypairs and their policies.

Quotas for the scheduler's predicates (issue 7):

* a keypair's :class:`KeypairResourcePolicy` — ``total_resource_slots`` with
  ``default_for_unspecified`` (LIMITED: unlisted slots are 0; UNLIMITED: infinite), plus
  ``max_concurrent_sessions`` and ``max_pending_session_count`` (0 = unlimited, as in
  ``accelshare.sched.model.KeypairLimits``) and ``max_pending_session_resource_slots``
  (NULL = unlimited);
* users, groups and domains carry ``total_resource_slots`` where unlisted slots are
  unlimited (Backend.AI's rule for domains and groups); an empty object = no limit.

Secret keys are stored in clear: the server needs them to recompute HMAC signatures
(spec 07).  Passwords are stored as scrypt hashes (see ``manager.passwords``).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from accelshare.common import DefaultForUnspecified, ResourceSlot
from accelshare.manager.clock import utcnow
from accelshare.manager.enums import UserRole, UserStatus

from .base import Base, ResourceSlotJSON, UTCDateTime, str_enum

__all__ = [
    "ACCESS_KEY_LENGTH",
    "SECRET_KEY_LENGTH",
    "USERS_EMAIL_LOWER_INDEX",
    "Domain",
    "Group",
    "GroupMember",
    "Keypair",
    "KeypairResourcePolicy",
    "User",
    "UserRole",
    "UserStatus",
    "email_matches",
]

ACCESS_KEY_LENGTH = 20
SECRET_KEY_LENGTH = 40


class Domain(Base):
    __tablename__ = "domains"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    description: Mapped[str] = mapped_column(sa.String(512), default="")
    is_active: Mapped[bool] = mapped_column(default=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(
        ResourceSlotJSON(), default=ResourceSlot
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class Group(Base):
    """A project inside a domain; sessions are charged to one group."""

    __tablename__ = "groups"
    __table_args__ = (sa.UniqueConstraint("domain_name", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(sa.String(64))
    domain_name: Mapped[str] = mapped_column(sa.ForeignKey("domains.name"), index=True)
    description: Mapped[str] = mapped_column(sa.String(512), default="")
    is_active: Mapped[bool] = mapped_column(default=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(
        ResourceSlotJSON(), default=ResourceSlot
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid(), primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(sa.String(128), unique=True)
    username: Mapped[str | None] = mapped_column(sa.String(64), unique=True)
    full_name: Mapped[str] = mapped_column(sa.String(128), default="")
    password_hash: Mapped[str] = mapped_column(sa.String(256))
    role: Mapped[UserRole] = mapped_column(str_enum(UserRole, 16), default=UserRole.USER)
    status: Mapped[UserStatus] = mapped_column(str_enum(UserStatus, 16), default=UserStatus.ACTIVE)
    # Console logins carry the value they were issued under; bumping it (logout, password
    # or status change, a keypair deactivated) ends every console login of the user at once.
    login_generation: Mapped[int] = mapped_column(
        sa.Integer(), default=0, server_default=sa.text("0")
    )
    domain_name: Mapped[str] = mapped_column(sa.ForeignKey("domains.name"), index=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(
        ResourceSlotJSON(), default=ResourceSlot
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    @property
    def is_active(self) -> bool:
        return self.status is UserStatus.ACTIVE


#: E-mail addresses are unique regardless of case (``USERA@x`` and ``usera@x`` are one
#: account): a unique index on ``lower(email)`` (migration 0008), which every look-up by
#: e-mail uses (:func:`email_matches`).
USERS_EMAIL_LOWER_INDEX = "uq_users_email_lower"
sa.Index(USERS_EMAIL_LOWER_INDEX, sa.func.lower(User.__table__.c.email), unique=True)


def email_matches(email: str) -> sa.ColumnElement[bool]:
    """``lower(users.email) = lower(:email)``: the database folds both sides the same way
    as its unique index does."""
    return sa.func.lower(User.email) == sa.func.lower(sa.literal(email, sa.String()))


class GroupMember(Base):
    """Which users may charge sessions to which groups."""

    __tablename__ = "group_members"

    group_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[uuid.UUID] = mapped_column(
        sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class KeypairResourcePolicy(Base):
    __tablename__ = "keypair_resource_policies"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    default_for_unspecified: Mapped[DefaultForUnspecified] = mapped_column(
        str_enum(DefaultForUnspecified, 16), default=DefaultForUnspecified.LIMITED
    )
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(
        ResourceSlotJSON(), default=ResourceSlot
    )
    max_concurrent_sessions: Mapped[int] = mapped_column(default=0)  # 0 = unlimited
    max_pending_session_count: Mapped[int] = mapped_column(default=0)  # 0 = unlimited
    max_pending_session_resource_slots: Mapped[ResourceSlot | None] = mapped_column(
        ResourceSlotJSON()
    )  # NULL = unlimited
    idle_timeout: Mapped[int] = mapped_column(default=0)  # seconds; 0 = never
    # storage folders (Backend.AI's names): how many a user may own, and each one's
    # size limit in bytes (given to the storage proxy as the folder's quota); 0 = unlimited
    max_vfolder_count: Mapped[int] = mapped_column(default=0, server_default=sa.text("0"))
    max_vfolder_size: Mapped[int] = mapped_column(
        sa.BigInteger(), default=0, server_default=sa.text("0")
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Keypair(Base):
    """An access key (``AKIA`` + 16 characters) and its 40-character secret."""

    __tablename__ = "keypairs"

    access_key: Mapped[str] = mapped_column(sa.String(ACCESS_KEY_LENGTH), primary_key=True)
    secret_key: Mapped[str] = mapped_column(sa.String(SECRET_KEY_LENGTH))
    user_id: Mapped[uuid.UUID] = mapped_column(sa.ForeignKey("users.id"), index=True)
    resource_policy: Mapped[str] = mapped_column(
        sa.ForeignKey("keypair_resource_policies.name"), index=True
    )
    is_active: Mapped[bool] = mapped_column(default=True)
    is_admin: Mapped[bool] = mapped_column(default=False)  # Backend.AI's flag, kept for clients
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
