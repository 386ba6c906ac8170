"""The GraphQL cost check (accelshare.api.gql_limits): what it counts and refuses."""

from __future__ import annotations

import itertools

import pytest
from graphql import get_introspection_query

from accelshare.api.gql_limits import GraphQLLimits, LimitExceeded, check_document
from component.manager.test_mgr_compat import (
    AGENT_INFO,
    AGENT_LIST,
    KEYPAIR,
    PS,
    SESSION_INFO,
    VFOLDER_LIST,
)

DEFAULTS = GraphQLLimits()


def cost(query: str, limits: GraphQLLimits = DEFAULTS) -> tuple[int, int, int]:
    found = check_document(query, limits)
    assert found is not None
    return found.depth, found.aliases, found.fields


def refusal(query: str, limits: GraphQLLimits) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as caught:
        check_document(query, limits)
    return caught.value


def test_counts_depth_aliases_and_fields() -> None:
    assert cost("{ a b { c d: e { f } } }") == (3, 1, 5)
    assert cost("query Q { x: a } query R { y: b { c } }") == (2, 2, 3)  # all operations


def test_fragments_are_counted_as_expanded() -> None:
    inline = "{ a { ... on T { b c { d } } } }"
    assert cost(inline) == (3, 0, 4)
    # A spread four times, B three times inside each: 12 copies of B's two fields
    spread = "{ a { ...A } } fragment A on T { ...B ...B ...B } fragment B on T { x: b c }"
    assert cost(spread + " query Other { z { ...A ...A ...A } }") == (2, 12, 2 + 4 * 3 * 2)


def test_an_exponential_fragment_chain_is_counted_without_expanding_it() -> None:
    names = [f"F{i}" for i in range(40)]
    fragments = " ".join(
        f"fragment {name} on T {{ ...{nxt} ...{nxt} }}" for name, nxt in itertools.pairwise(names)
    )
    query = f"{{ a {{ ...F0 }} }} {fragments} fragment F39 on T {{ b }}"
    error = refusal(query, DEFAULTS)
    assert (error.limit, error.value, error.received) == ("max-fields", 1000, 1 + 2**39)


def test_a_fragment_that_spreads_itself_or_is_missing_counts_nothing() -> None:
    # graphql's validation refuses both afterwards (strawberry answers the error)
    assert cost("{ a { ...A ...Missing } } fragment A on T { b ...A }") == (2, 0, 2)


@pytest.mark.parametrize(
    ("limits", "query", "limit", "value", "received"),
    [
        (GraphQLLimits(max_depth=3), "{ a { b { c { d } } } }", "max-depth", 3, 4),
        (GraphQLLimits(max_aliases=2), "{ x: a y: b z: c }", "max-aliases", 2, 3),
        (GraphQLLimits(max_fields=4), "{ a { b c d } e }", "max-fields", 4, 5),
        (GraphQLLimits(max_tokens=10), "{ a b c d e f g h i j }", "max-tokens", 10, "more than 10"),
    ],
)
def test_over_a_limit_names_it_its_value_and_the_received_amount(
    limits: GraphQLLimits, query: str, limit: str, value: int, received: int | str
) -> None:
    error = refusal(query, limits)
    assert (error.limit, error.value, error.received) == (limit, value, received)
    assert f"({limit} = {value})" in str(error)
    assert str(received) in str(error)


def test_at_the_limit_is_accepted() -> None:
    assert cost("{ a { b { c } } }", GraphQLLimits(max_depth=3)) == (3, 0, 3)
    assert cost("{ x: a y: b }", GraphQLLimits(max_aliases=2, max_fields=2)) == (1, 2, 2)


def test_nesting_beyond_what_the_parser_takes_is_a_depth_refusal() -> None:
    query = "{" + "a{" * 2000 + "b" + "}" * 2000 + "}"
    error = refusal(query, GraphQLLimits(max_tokens=10_000))
    assert error.limit == "max-depth"
    assert error.received == "too deep to parse"


def test_a_syntax_error_is_left_to_strawberry() -> None:
    assert check_document("{ a { b }", DEFAULTS) is None


@pytest.mark.parametrize("query", [KEYPAIR, PS, AGENT_LIST, AGENT_INFO, SESSION_INFO, VFOLDER_LIST])
def test_the_official_clients_queries_are_well_under_the_defaults(query: str) -> None:
    depth, aliases, fields = cost(query)
    assert depth <= DEFAULTS.max_depth // 4
    assert aliases == 0
    assert fields <= DEFAULTS.max_fields // 10


def test_the_standard_introspection_query_is_accepted() -> None:
    depth, _aliases, fields = cost(get_introspection_query(descriptions=True))
    assert depth < DEFAULTS.max_depth
    assert fields < DEFAULTS.max_fields
