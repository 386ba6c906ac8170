"""Who acts: the one narrow view of the authenticated caller that every manager service
takes (sessions, folders, the admin views, execute, events, session files).

``accelshare.api.auth.Identity`` satisfies it; services never import the API layer, and
tests pass any object with these attributes.
"""

from __future__ import annotations

import uuid
from typing import Protocol

from ..enums import UserRole

__all__ = ["Actor"]


class Actor(Protocol):
    """The user on whose behalf a service call runs, with its role and scope."""

    @property
    def user_id(self) -> uuid.UUID: ...

    @property
    def email(self) -> str: ...

    @property
    def role(self) -> UserRole: ...

    @property
    def domain_name(self) -> str: ...

    @property
    def access_key(self) -> str: ...

    @property
    def resource_policy(self) -> str: ...

    @property
    def is_superadmin(self) -> bool: ...
