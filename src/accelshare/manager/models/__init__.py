"""The manager's tables (SQLAlchemy 2 typed ORM; SQLite and PostgreSQL).

``Base.metadata`` is the target of the Alembic migrations in
``accelshare/manager/migrations``; a test checks that the migrations produce exactly
this schema on both databases.
"""

from .agents import (
    DEFAULT_SCHEDULER_OPTS,
    DEFAULT_SESSION_SLOTS,
    Agent,
    AgentHeldRevision,
    AgentSelectionStrategy,
    AgentStatus,
    ScalingGroup,
)
from .app_tokens import UsedAppToken
from .base import NAMING_CONVENTION, Base, JSONDocument, ResourceSlotJSON, UTCDateTime
from .folders import (
    InvitationState,
    SessionVFolderMount,
    VFolder,
    VFolderInvitation,
    VFolderOwnershipType,
    VFolderPermission,
    VFolderPermissionGrant,
    VFolderStatus,
    VFolderUsageMode,
)
from .identity import (
    ACCESS_KEY_LENGTH,
    SECRET_KEY_LENGTH,
    USERS_EMAIL_LOWER_INDEX,
    Domain,
    Group,
    GroupMember,
    Keypair,
    KeypairResourcePolicy,
    User,
    UserRole,
    UserStatus,
    email_matches,
)
from .images import Image, ImageAlias
from .scaling_group_access import (
    ScalingGroupForDomain,
    ScalingGroupForGroup,
    ScalingGroupForKeypair,
)
from .sessions import (
    DEFAULT_PRIORITY,
    Kernel,
    KernelEventRecord,
    Session,
    SessionDependency,
    SessionStatusHistory,
)

__all__ = [
    "ACCESS_KEY_LENGTH",
    "DEFAULT_PRIORITY",
    "DEFAULT_SCHEDULER_OPTS",
    "DEFAULT_SESSION_SLOTS",
    "NAMING_CONVENTION",
    "SECRET_KEY_LENGTH",
    "USERS_EMAIL_LOWER_INDEX",
    "Agent",
    "AgentHeldRevision",
    "AgentSelectionStrategy",
    "AgentStatus",
    "Base",
    "Domain",
    "Group",
    "GroupMember",
    "Image",
    "ImageAlias",
    "InvitationState",
    "JSONDocument",
    "Kernel",
    "KernelEventRecord",
    "Keypair",
    "KeypairResourcePolicy",
    "ResourceSlotJSON",
    "ScalingGroup",
    "ScalingGroupForDomain",
    "ScalingGroupForGroup",
    "ScalingGroupForKeypair",
    "Session",
    "SessionDependency",
    "SessionStatusHistory",
    "SessionVFolderMount",
    "UTCDateTime",
    "UsedAppToken",
    "User",
    "UserRole",
    "UserStatus",
    "VFolder",
    "VFolderInvitation",
    "VFolderOwnershipType",
    "VFolderPermission",
    "VFolderPermissionGrant",
    "VFolderStatus",
    "VFolderUsageMode",
    "email_matches",
]
