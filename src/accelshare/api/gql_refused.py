"""Backend.AI root fields accelshare does not have, answered with what to use instead.

The official client 25.5.2 asks for root fields of features accelshare does not offer
(model serving, inter-session networks, customized images, container registry quotas).
Left to graphql-core they fail validation as ``Cannot query field 'networks' on type
'Query'``; :data:`REFUSED_ROOT_FIELDS` is the one table of them, and
:class:`RefusedRootFieldsRule` (installed by the schema extension
:class:`RefusedRootFields`) answers each with the text every other refusal of the
GraphQL surface carries (:class:`~.gql_admin.common.NotSupportedByAccelshare`)::

    Not supported by accelshare: inter-session networks. ... (see docs/compatibility.md)

The rule takes the place of graphql-core's ``FieldsOnCorrectTypeRule`` and does only
that for a root field of ``Query`` / ``Mutation`` named in the table and absent from the
schema; every other field keeps graphql-core's check and message.  The document is
refused at validation, before anything runs; the refused field's sub-selection and
arguments are not checked (graphql-core knows no type for them), so the refusal is the
only error the field causes.  The cost limits (:mod:`.gql_limits`) and the refusal of
mutations while frozen (:mod:`.gql`) come first: they are checked before strawberry
parses the document.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from graphql import FieldNode, GraphQLError
from graphql.validation import FieldsOnCorrectTypeRule
from strawberry.extensions import SchemaExtension

from .gql_admin.common import NotSupportedByAccelshare
from .gql_admin.quota_scopes import HOST_PERMISSIONS

__all__ = ["REFUSED_ROOT_FIELDS", "Refusal", "RefusedRootFields", "RefusedRootFieldsRule"]


@dataclass(frozen=True)
class Refusal:
    """A root field of ``root`` that answers :class:`NotSupportedByAccelshare`."""

    root: Literal["Query", "Mutation"]
    feature: str
    instead: str

    @property
    def message(self) -> str:
        return str(NotSupportedByAccelshare(self.feature, self.instead))


_MODEL_SERVING = (
    "model serving",
    "accelshare has no model serving (`backend.ai service`, `model`): no endpoints,"
    " inference sessions or auto-scaling rules; the REST routes /services answer 501"
    " model-serving",
)
_NETWORKS = (
    "inter-session networks",
    "accelshare creates no networks between sessions; reach a session's declared services"
    " with `backend.ai app`",
)
_CUSTOMIZED_IMAGES = (
    "customized images (sessions committed as images)",
    "a session cannot be saved as an image; build images outside and register them with"
    " `accelshare admin image add REF`",
)
_REGISTRY_QUOTAS = (
    "container registry quotas",
    "accelshare keeps no container registries to put a quota on: images are registered in"
    " its catalogue (`accelshare admin image add REF`)",
)
_UNTAG = (
    "untagging images in a registry",
    "accelshare does not manage container registries; remove an image from the catalogue"
    " with `backend.ai image forget REF` or `accelshare admin image remove REF`",
)


def _table(
    root: Literal["Query", "Mutation"], feature: tuple[str, str], *names: str
) -> dict[str, Refusal]:
    return {name: Refusal(root, *feature) for name in names}


# field -> the feature it belongs to and what to use instead (docs/compatibility.md)
REFUSED_ROOT_FIELDS: dict[str, Refusal] = {
    **_table(
        "Query",
        _MODEL_SERVING,
        "endpoint",
        "endpoint_list",
        "endpoint_auto_scaling_rule_node",
        "endpoint_auto_scaling_rule_nodes",
        "inference_session_list",
    ),
    **_table(
        "Mutation",
        _MODEL_SERVING,
        "create_endpoint_auto_scaling_rule_node",
        "modify_endpoint_auto_scaling_rule_node",
        "delete_endpoint_auto_scaling_rule_node",
    ),
    **_table("Query", _NETWORKS, "network", "networks"),
    **_table("Mutation", _NETWORKS, "create_network", "modify_network", "delete_network"),
    **_table("Query", _CUSTOMIZED_IMAGES, "customized_images"),
    **_table("Query", _REGISTRY_QUOTAS, "group_node"),
    **_table(
        "Mutation",
        _REGISTRY_QUOTAS,
        "create_container_registry_quota",
        "update_container_registry_quota",
        "delete_container_registry_quota",
    ),
    **_table("Mutation", _UNTAG, "untag_image_from_registry"),
    **_table("Query", HOST_PERMISSIONS, "vfolder_host_permission_list"),
}


class RefusedRootFieldsRule(FieldsOnCorrectTypeRule):
    """graphql-core's ``FieldsOnCorrectTypeRule``, but a root field of
    :data:`REFUSED_ROOT_FIELDS` the schema does not define is reported with the
    table's refusal instead of "Cannot query field"."""

    def enter_field(self, node: FieldNode, *args: Any) -> None:
        refusal = self._refusal(node)
        if refusal is None:
            super().enter_field(node, *args)
            return
        self.report_error(GraphQLError(refusal.message, node))

    def _refusal(self, node: FieldNode) -> Refusal | None:
        refusal = REFUSED_ROOT_FIELDS.get(node.name.value)
        if refusal is None or self.context.get_field_def() is not None:
            return None
        parent = self.context.get_parent_type()
        schema = self.context.schema
        root = {"Query": schema.query_type, "Mutation": schema.mutation_type}[refusal.root]
        return refusal if parent is not None and parent is root else None


class RefusedRootFields(SchemaExtension):
    """Puts :class:`RefusedRootFieldsRule` in the place of ``FieldsOnCorrectTypeRule``
    among the request's validation rules (none is added where that rule is not run)."""

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        context.validation_rules = tuple(
            RefusedRootFieldsRule if rule is FieldsOnCorrectTypeRule else rule
            for rule in context.validation_rules
        )
        yield
