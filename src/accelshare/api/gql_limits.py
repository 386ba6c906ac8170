"""The cost limits of ``/admin/gql``: checked on the document before strawberry runs it.

A request is refused with ``400`` (problem ``graphql-too-complex``) when its document
has more than

* ``max-tokens`` lexical tokens (the parse stops there: graphql-core's ``max_tokens``);
* ``max-depth`` nested selection levels;
* ``max-aliases`` aliased fields;
* ``max-fields`` selected fields in all,

counted with every fragment spread expanded (a fragment spread twice counts twice, as
the execution would run it twice).  The problem names the limit, its value and what the
request had (``limit``, ``limit_value``, ``received``).  A refused request is one log
line, never a traceback.

The defaults (``[api.graphql]``, docs/configuration.md) are far above what the official
Backend.AI client sends (no alias, depth 3, 40 fields, 200 tokens at most) and above
the standard introspection query (depth 15, 229 fields).  Page sizes (``limit`` of the ``*_list`` queries)
are checked where the arguments are known, in :mod:`.gql`.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    parse,
)

__all__ = [
    "DocumentCost",
    "GraphQLLimits",
    "LimitExceeded",
    "check_cost",
    "check_document",
    "document_cost",
    "parse_document",
]

MAX_PAGE_SIZE = 1000  # like REST's ``limit`` (GET /sessions)


@dataclass(frozen=True, slots=True)
class GraphQLLimits:
    max_depth: int = 20
    max_aliases: int = 30
    max_fields: int = 1000
    max_tokens: int = 5000


@dataclass(frozen=True, slots=True)
class DocumentCost:
    depth: int
    aliases: int
    fields: int


class LimitExceeded(ValueError):
    """The document is over one limit: ``limit`` (its config key), ``value``, ``received``."""

    def __init__(self, limit: str, value: int, received: int | str, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.received = received


def _selection_cost(
    selection_set: SelectionSetNode | None,
    fragments: dict[str, FragmentDefinitionNode],
    memo: dict[str, DocumentCost],
    visiting: set[str],
) -> DocumentCost:
    """The cost of a selection set with fragments expanded (each fragment computed once:
    linear time even where the expansion is exponential).  A fragment that spreads
    itself counts nothing here; graphql's validation refuses it afterwards."""
    depth = aliases = fields = 0
    if selection_set is None:
        return DocumentCost(0, 0, 0)
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            inner = _selection_cost(selection.selection_set, fragments, memo, visiting)
            depth = max(depth, inner.depth + 1)
            aliases += inner.aliases + (selection.alias is not None)
            fields += inner.fields + 1
        elif isinstance(selection, InlineFragmentNode):
            inner = _selection_cost(selection.selection_set, fragments, memo, visiting)
            depth, aliases, fields = (
                max(depth, inner.depth),
                aliases + inner.aliases,
                fields + inner.fields,
            )
        elif isinstance(selection, FragmentSpreadNode):
            name = selection.name.value
            if name not in memo:
                fragment = fragments.get(name)
                if fragment is None or name in visiting:
                    continue
                visiting.add(name)
                memo[name] = _selection_cost(fragment.selection_set, fragments, memo, visiting)
                visiting.discard(name)
            inner = memo[name]
            depth, aliases, fields = (
                max(depth, inner.depth),
                aliases + inner.aliases,
                fields + inner.fields,
            )
    return DocumentCost(depth, aliases, fields)


def document_cost(document: DocumentNode) -> DocumentCost:
    """Depth (the deepest operation), aliases and fields (all operations together)."""
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    memo: dict[str, DocumentCost] = {}
    depth = aliases = fields = 0
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            cost = _selection_cost(definition.selection_set, fragments, memo, set())
            depth, aliases, fields = (
                max(depth, cost.depth),
                aliases + cost.aliases,
                fields + cost.fields,
            )
    return DocumentCost(depth, aliases, fields)


def parse_document(query: str, limits: GraphQLLimits) -> DocumentNode | None:
    """``query`` parsed within ``max-tokens`` (None when it does not parse: strawberry
    answers the syntax error); :class:`LimitExceeded` when the parse stops at a limit."""
    try:
        return parse(query, max_tokens=limits.max_tokens, no_location=True)
    except GraphQLError as e:
        if "Parsing aborted" not in e.message:
            return None
        if "nested too deeply" in e.message:  # graphql-core's own bound on nesting
            raise LimitExceeded(
                "max-depth",
                limits.max_depth,
                "too deep to parse",
                f"The GraphQL document is nested too deeply to parse; at most "
                f"{limits.max_depth} levels are allowed (max-depth = {limits.max_depth})",
            ) from None
        raise LimitExceeded(
            "max-tokens",
            limits.max_tokens,
            f"more than {limits.max_tokens}",
            f"The GraphQL document has more than {limits.max_tokens} tokens; at most "
            f"{limits.max_tokens} are allowed (max-tokens = {limits.max_tokens})",
        ) from None


def check_cost(document: DocumentNode, limits: GraphQLLimits) -> DocumentCost:
    """Raise :class:`LimitExceeded` when ``document`` is over a limit; its cost otherwise."""
    cost = document_cost(document)
    for limit, value, received, what in (
        ("max-depth", limits.max_depth, cost.depth, "nesting levels"),
        ("max-aliases", limits.max_aliases, cost.aliases, "aliased fields"),
        ("max-fields", limits.max_fields, cost.fields, "selected fields (fragments expanded)"),
    ):
        if received > value:
            raise LimitExceeded(
                limit,
                value,
                received,
                f"The GraphQL document has {received} {what}; at most {value} are allowed "
                f"({limit} = {value})",
            )
    return cost


def check_document(query: str, limits: GraphQLLimits) -> DocumentCost | None:
    """Raise :class:`LimitExceeded` when ``query`` is over a limit; its cost otherwise
    (None when it does not parse: strawberry answers the syntax error)."""
    document = parse_document(query, limits)
    return None if document is None else check_cost(document, limits)
