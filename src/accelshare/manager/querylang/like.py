"""SQL LIKE patterns (``%`` any run, ``_`` one character, ``\\`` escapes the next one)
as the query language means them, for SQLite's GLOB and Python's ``re`` (no I/O)."""

from __future__ import annotations

import re

__all__ = ["escape_like", "like_to_glob", "like_to_regex", "normalize_like"]


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """``[("any", ""), ("one", ""), ("lit", "x")...]``; a trailing lone ``\\`` is literal."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(("lit", pattern[i + 1]))
            i += 2
            continue
        if ch == "%":
            out.append(("any", ""))
        elif ch == "_":
            out.append(("one", ""))
        else:
            out.append(("lit", ch))
        i += 1
    return out


def escape_like(text: str) -> str:
    """``text`` matched literally inside a LIKE pattern."""
    return re.sub(r"([\\%_])", r"\\\1", text)


def normalize_like(pattern: str) -> str:
    """The same pattern with ``\\`` only before ``%``, ``_`` and ``\\`` (a trailing lone
    ``\\`` made PostgreSQL refuse the pattern; an escaped plain character is itself)."""
    parts = []
    for kind, ch in _tokens(pattern):
        if kind == "any":
            parts.append("%")
        elif kind == "one":
            parts.append("_")
        else:
            parts.append(escape_like(ch))
    return "".join(parts)


def like_to_glob(pattern: str) -> str:
    """The case-sensitive GLOB pattern matching what ``LIKE pattern ESCAPE '\\'`` does
    on PostgreSQL (SQLite's LIKE ignores ASCII case)."""
    parts = []
    for kind, ch in _tokens(pattern):
        if kind == "any":
            parts.append("*")
        elif kind == "one":
            parts.append("?")
        elif ch in "*?[":
            parts.append(f"[{ch}]")
        else:
            parts.append(ch)
    return "".join(parts)


def like_to_regex(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    parts = []
    for kind, ch in _tokens(pattern):
        if kind == "any":
            parts.append(".*")
        elif kind == "one":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile("".join(parts), flags)
