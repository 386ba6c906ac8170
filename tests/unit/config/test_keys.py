"""Key paths, quoting and tree (un)flattening: pure functions."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.config.errors import InvalidKey, InvalidTree
from accelshare.config.keys import (
    flatten_tree,
    merge_trees,
    normalize_component,
    split_key,
    stringify_value,
    unflatten_pairs,
)


@pytest.mark.parametrize(
    ("key", "components"),
    [
        ("config/agent", ["config", "agent"]),
        ("/config/agent/", ["config", "agent"]),
        ("a b/é", ["a%20b", "%C3%A9"]),
        ("a%20b/x%2Fy", ["a%20b", "x%2Fy"]),  # already quoted: unchanged
        ("cuda.device:10g-mig", ["cuda.device%3A10g-mig"]),
        ("50%", ["50%25"]),
        ("%25", ["%25"]),
    ],
)
def test_split_key_normalises_components(key: str, components: list[str]) -> None:
    assert split_key(key) == components


@pytest.mark.parametrize("key", ["", "/", "//"])
def test_the_root_needs_permission(key: str) -> None:
    assert split_key(key, allow_root=True) == []
    with pytest.raises(InvalidKey, match="must not be empty"):
        split_key(key)


def test_empty_components_are_refused() -> None:
    with pytest.raises(InvalidKey, match="empty path component"):
        split_key("a//b", allow_root=True)


@given(st.text())
def test_normalising_is_idempotent(name: str) -> None:
    once = normalize_component(name)
    assert normalize_component(once) == once


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("x", "x"),
        ("", ""),
        (True, "true"),
        (False, "false"),
        (10, "10"),
        (0.5, "0.5"),
        (Decimal("1.50"), "1.50"),
    ],
)
def test_stringify(value: Any, text: str) -> None:
    assert stringify_value(value, "k") == text


@pytest.mark.parametrize("value", [None, object()])
def test_stringify_refuses_non_scalars(value: Any) -> None:
    with pytest.raises(InvalidTree, match="'k'"):
        stringify_value(value, "k")


def test_flatten_and_unflatten() -> None:
    tree = {"a": {"": "own", "b c": {"d/e": 1}}, "é": True, "empty": ""}
    flat = flatten_tree(tree)
    assert flat == {"a": "own", "a/b%20c/d%2Fe": "1", "%C3%A9": "true", "empty": ""}
    assert unflatten_pairs(sorted(flat.items())) == {
        "a": {"": "own", "b c": {"d/e": "1"}},
        "é": "true",
        "empty": "",
    }


def test_unflatten_in_any_order() -> None:
    assert unflatten_pairs([("a/b", "2"), ("a", "1"), ("", "root")]) == {
        "": "root",
        "a": {"": "1", "b": "2"},
    }


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ([1, 2], "expected an object"),
        ({"a": [1]}, "'a' is a list"),
        ({"a": {"b": None}}, "'a/b' is null"),
        ({"a": {"": {"x": "1"}}}, "own value"),
        ({3: "x"}, "not a string"),
    ],
)
def test_flatten_refuses_bad_trees(tree: Any, message: str) -> None:
    with pytest.raises(InvalidTree, match=message):
        flatten_tree(tree)


def test_merge_trees_deep_with_override_winning() -> None:
    base = {"a": "1", "b": {"c": "2", "d": "3"}, "e": {"f": "4"}}
    override = {"a": {"x": "9"}, "b": {"c": "20"}, "e": "5"}
    assert merge_trees(base, override) == {
        "a": {"": "1", "x": "9"},
        "b": {"c": "20", "d": "3"},
        "e": {"": "5", "f": "4"},
    }
    assert base == {"a": "1", "b": {"c": "2", "d": "3"}, "e": {"f": "4"}}  # not mutated


# Trees as get_prefix returns them: leaves are strings, a '' key holds a node's own value
# and only appears beside children.
_names = st.text(min_size=1, max_size=8)
_leaf = st.text(max_size=8)
_trees: st.SearchStrategy[dict[str, Any]] = st.recursive(
    st.dictionaries(_names, _leaf, min_size=1, max_size=4),
    lambda children: st.builds(
        lambda own, kids: {**kids, **({"": own[0]} if own else {})},
        st.lists(_leaf, max_size=1),
        st.dictionaries(_names, children | _leaf, min_size=1, max_size=4),
    ),
    max_leaves=20,
)


@given(_trees)
def test_flatten_unflatten_round_trip(tree: dict[str, Any]) -> None:
    flat = flatten_tree(tree)
    assert unflatten_pairs(sorted(flat.items())) == tree
    # Stored keys are canonical: re-normalising them changes nothing.
    for path in flat:
        assert "/".join(split_key(path, allow_root=True)) == path
