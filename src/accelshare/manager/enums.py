"""The manager's enumerations that the API layer names too (roles, user and agent
statuses), in a module without the ORM so that ``accelshare.api`` can import them.

The tables in :mod:`accelshare.manager.models` store them as their values.
"""

from __future__ import annotations

import enum

__all__ = [
    "AgentStatus",
    "InvitationState",
    "UserRole",
    "UserStatus",
    "VFolderOwnershipType",
    "VFolderPermission",
    "VFolderStatus",
    "VFolderUsageMode",
]


class UserRole(enum.StrEnum):
    """Ordered: every role can do what the roles before it can."""

    USER = "user"  # own sessions only
    ADMIN = "admin"  # one domain
    SUPERADMIN = "superadmin"  # everything: agents, configuration, all domains

    @property
    def rank(self) -> int:
        return _ROLE_RANK[self]

    def includes(self, other: UserRole) -> bool:
        """``ADMIN.includes(USER)`` is True; ``USER.includes(ADMIN)`` is False."""
        return self.rank >= other.rank


_ROLE_RANK = {UserRole.USER: 0, UserRole.ADMIN: 1, UserRole.SUPERADMIN: 2}


class UserStatus(enum.StrEnum):
    ACTIVE = "active"
    INACTIVE = "inactive"  # may not log in or sign requests
    DELETED = "deleted"  # kept for the sessions that reference it


class AgentStatus(enum.StrEnum):
    ALIVE = "ALIVE"
    LOST = "LOST"  # missed heartbeats for agent-timeout; reconciled when it returns
    TERMINATED = "TERMINATED"  # shut down cleanly


# -- storage folders (Backend.AI's vfolders) ----------------------------------------------


class VFolderOwnershipType(enum.StrEnum):
    USER = "user"
    GROUP = "group"


class VFolderPermission(enum.StrEnum):
    READ_ONLY = "ro"
    READ_WRITE = "rw"
    RW_DELETE = "wd"  # read, write and delete (the owner's)

    @property
    def can_write(self) -> bool:
        return self is not VFolderPermission.READ_ONLY


class VFolderUsageMode(enum.StrEnum):
    GENERAL = "general"
    MODEL = "model"
    DATA = "data"


class VFolderStatus(enum.StrEnum):
    """Backend.AI's ``VFolderOperationStatus`` names."""

    READY = "ready"
    PERFORMING = "performing"
    CLONING = "cloning"
    MOUNTED = "mounted"
    ERROR = "error"
    DELETE_PENDING = "delete-pending"  # in the trash
    DELETE_ONGOING = "delete-ongoing"  # being purged
    DELETE_COMPLETE = "delete-complete"
    DELETE_ERROR = "delete-error"


class InvitationState(enum.StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CANCELED = "canceled"
