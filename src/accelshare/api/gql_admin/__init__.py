"""Backend.AI's admin GraphQL surface, as the official client 25.5.2 asks it: what maps
onto accelshare works, the rest is refused with an error that says what to use instead.

:class:`AdminQuery` and :class:`AdminMutation` assemble the parts, in the schema's field
order; :mod:`accelshare.api.gql` adds them to the schema:

* :mod:`.users` — users and keypairs;
* :mod:`.domains` — domains and groups;
* :mod:`.scaling_groups` — scaling groups and their associations;
* :mod:`.resource_policies` — keypair resource policies;
* :mod:`.images` — image aliases (registry rescans refused);
* :mod:`.quota_scopes` — quota scopes and folder host permissions (refused);
* :mod:`.common` — the caller's role, page sizes, JSON-string inputs, the settings
  accelshare does not keep.
"""

from __future__ import annotations

import strawberry

from .domains import DomainMutation, DomainQuery
from .images import ImageMutation
from .quota_scopes import QuotaScopeMutation, QuotaScopeQuery
from .resource_policies import ResourcePolicyMutation, ResourcePolicyQuery
from .scaling_groups import ScalingGroupAssociationMutation, ScalingGroupMutation, ScalingGroupQuery
from .users import UserMutation, UserQuery

__all__ = ["AdminMutation", "AdminQuery"]


@strawberry.type
class AdminQuery(UserQuery, DomainQuery, ScalingGroupQuery, ResourcePolicyQuery, QuotaScopeQuery):
    """The admin queries."""


@strawberry.type
class AdminMutation(
    UserMutation,
    DomainMutation,
    ScalingGroupMutation,
    ResourcePolicyMutation,
    ImageMutation,
    ScalingGroupAssociationMutation,
    QuotaScopeMutation,
):
    """The admin mutations."""
