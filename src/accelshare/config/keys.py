"""Key paths and nested trees of the configuration store (pure, no I/O).

A *key path* is a ``/``-separated list of components: ``config/plugins/accelerator/cuda``.
Each component is stored URL-quoted (``urllib.parse.quote(name, safe="")``, as
Backend.AI's ``put_prefix`` does), so that a name may contain ``/``, spaces or any
unicode character.  Key paths given by callers may use plain or quoted components:
both are normalised to the same stored form with ``quote(unquote(c))``::

    "a b/x%2Fy/é"  ->  "a%20b/x%2Fy/%C3%A9"

so ``get("a b")`` finds what ``put_prefix("", {"a b": ...})`` wrote.  (The one thing a
plain component cannot say is a literal ``%XX``: write ``%25XX`` for it.)

A *tree* is a nested dict whose leaves are strings.  A key that has both a value and
children keeps its own value under the key ``""``::

    pairs {"a": "1", "a/b": "2", "c%2Fd": "3"}  <->  {"a": {"": "1", "b": "2"}, "c/d": "3"}
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias
from urllib.parse import quote, unquote

from .errors import InvalidKey, InvalidTree

__all__ = [
    "NestedDict",
    "flatten_tree",
    "join_key",
    "merge_trees",
    "normalize_component",
    "split_key",
    "stringify_value",
    "unflatten_pairs",
]

NestedDict: TypeAlias = dict[str, Any]  # values are str or NestedDict


def normalize_component(component: str) -> str:
    """The stored (quoted) form of one path component; idempotent."""
    return quote(unquote(component), safe="")


def split_key(key: str, *, allow_root: bool = False, what: str = "key") -> list[str]:
    """Split a key path into normalised components.

    Leading and trailing ``/`` are ignored.  ``""`` (the root) is refused unless
    ``allow_root``; an empty component in the middle (``a//b``) is always refused.
    """
    stripped = key.strip("/")
    if not stripped:
        if allow_root:
            return []
        raise InvalidKey(
            f"the {what} must not be empty", expected="a non-empty key path", received=key
        )
    parts = stripped.split("/")
    if any(not part for part in parts):
        raise InvalidKey(
            f"the {what} {key!r} has an empty path component",
            expected="components separated by single '/'",
            received=key,
        )
    return [normalize_component(part) for part in parts]


def join_key(*parts: str) -> str:
    """Join already-normalised key paths, skipping empty ones."""
    return "/".join(part for part in parts if part)


def stringify_value(value: Any, path: str) -> str:
    """The string stored for a tree leaf (JSON spelling for booleans)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    kind = "null" if value is None else type(value).__name__
    raise InvalidTree(
        f"the value at {path or '(root)'!r} is {kind}, which cannot be stored",
        expected="a string, number, boolean or object",
        received=value,
    )


def flatten_tree(tree: Mapping[str, Any]) -> dict[str, str]:
    """Flatten a tree into relative key paths (``""`` = the prefix's own value).

    >>> flatten_tree({"a": {"": 1, "b c": True}, "d/e": "x"})
    {'a': '1', 'a/b%20c': 'true', 'd%2Fe': 'x'}
    """
    if not isinstance(tree, Mapping):
        raise InvalidTree(
            f"expected an object, got {type(tree).__name__}",
            expected="an object",
            received=tree,
        )
    flat: dict[str, str] = {}
    _flatten_into(flat, "", "", tree)
    return flat


def _flatten_into(flat: dict[str, str], stored: str, shown: str, tree: Mapping[str, Any]) -> None:
    for name, value in tree.items():
        if not isinstance(name, str):
            raise InvalidTree(
                f"the key {name!r} under {shown or '(root)'!r} is not a string",
                expected="string keys",
                received=name,
            )
        if name == "":
            if isinstance(value, Mapping):
                raise InvalidTree(
                    f"the own value ('' key) of {shown or '(root)'!r} is an object",
                    expected="a string, number or boolean under ''",
                    received=value,
                )
            child_stored, child_shown = stored, shown
        else:
            child_stored = join_key(stored, quote(name, safe=""))
            child_shown = f"{shown}/{name}" if shown else name
        if isinstance(value, Mapping):
            _flatten_into(flat, child_stored, child_shown, value)
        elif isinstance(value, list | tuple | set):
            raise InvalidTree(
                f"the value at {child_shown or '(root)'!r} is a list, which cannot be stored",
                expected="a string, number, boolean or object",
                received=value,
            )
        else:
            flat[child_stored] = stringify_value(value, child_shown)


def unflatten_pairs(pairs: Iterable[tuple[str, str]]) -> NestedDict:
    """Build a tree from ``(relative stored path, value)`` pairs; names are unquoted.

    >>> unflatten_pairs([("a", "1"), ("a/b", "2"), ("c%2Fd", "3")])
    {'a': {'': '1', 'b': '2'}, 'c/d': '3'}
    """
    result: NestedDict = {}
    for path, value in pairs:
        if path == "":
            result[""] = value
            continue
        names = [unquote(component) for component in path.split("/")]
        parent = result
        for name in names[:-1]:
            child = parent.get(name)
            if not isinstance(child, dict):
                child = {} if child is None else {"": child}
                parent[name] = child
            parent = child
        last = names[-1]
        if isinstance(parent.get(last), dict):
            parent[last][""] = value
        else:
            parent[last] = value
    return result


def merge_trees(base: NestedDict, override: NestedDict) -> NestedDict:
    """Deep-merge two trees; ``override`` wins.  A leaf meeting a subtree becomes ``""``.

    >>> merge_trees({"a": "1", "b": {"c": "2"}}, {"a": {"x": "9"}, "b": {"c": "3"}})
    {'a': {'': '1', 'x': '9'}, 'b': {'c': '3'}}
    """
    result: NestedDict = dict(base)
    for name, value in override.items():
        current = result.get(name)
        if isinstance(value, dict) or isinstance(current, dict):
            result[name] = merge_trees(_as_tree(current), _as_tree(value))
        else:
            result[name] = value
    return result


def _as_tree(value: Any) -> NestedDict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {"": value}
