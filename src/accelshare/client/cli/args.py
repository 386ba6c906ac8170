"""Parsing of repeatable ``KEY=VALUE`` options (pure; errors say what to type instead).

* ``-r/--resources``: ``cpu=1``, ``mem=1g``, ``cuda.shares=0.2``.  A bare ``mem``
  number means MiB, as in Backend.AI's client: ``mem=256`` -> ``256m``.  The server
  checks slot names and amounts against the cluster (unknown slot, quantum); here
  the shape and the sign are checked by the strict parser of the pure core
  (``1_0``, full-width digits or junk are an error line, never a guess).
* ``--resource-opts`` / ``--opt``: values read as JSON when they parse
  (``true``, ``3``, ``[1, 2]``), else kept as strings.
* ``-e/--env``: ``NAME=value`` strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from accelshare.common import CommonValueError, SlotTypes, parse_amount

__all__ = ["ArgumentError", "parse_environ", "parse_json_pairs", "parse_pairs", "parse_resources"]

_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_SLOT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ArgumentError(ValueError):
    """A malformed command-line value; the message is the whole error line."""


def parse_pairs(values: Sequence[str], option: str, example: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a repeated key is an error."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ArgumentError(f"{option} {raw!r}: expected KEY=VALUE, e.g. {option} {example}")
        if key in out:
            raise ArgumentError(f"{option}: {key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def parse_resources(values: Sequence[str]) -> dict[str, str]:
    """``-r`` values -> the request's ``resources`` (amounts stay user input)."""
    resources = parse_pairs(values, "-r", "cuda.shares=0.5")
    for slot, amount in resources.items():
        if not _SLOT_RE.match(slot):
            raise ArgumentError(
                f"-r {slot}={amount}: {slot!r} is not a slot name (such as cpu, mem, cuda.shares;"
                " `accelshare config slots` lists this cluster's)"
            )
        if amount.startswith("-"):
            raise ArgumentError(
                f"-r {slot}={amount}: amounts cannot be negative; ask for a positive amount"
                " (or leave the slot out)"
            )
        kind = SlotTypes.BYTES if "mem" in slot else SlotTypes.COUNT
        try:
            parse_amount(slot, amount, kind)
        except CommonValueError as e:
            raise ArgumentError(f"-r {slot}={amount}: expected {e.expected}") from None
        if slot == "mem" and _PLAIN_NUMBER.fullmatch(amount):
            resources[slot] = f"{amount}m"  # a bare number: MiB
    return resources


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_json_pairs(values: Sequence[str], option: str, example: str) -> dict[str, Any]:
    """``K=V`` pairs whose values are JSON when they parse, else strings."""
    return {k: _json_or_text(v) for k, v in parse_pairs(values, option, example).items()}


def parse_environ(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in values:
        name, sep, value = raw.partition("=")
        if not sep or not _ENV_RE.match(name):
            raise ArgumentError(f"-e {raw!r}: expected NAME=VALUE, e.g. -e OMP_NUM_THREADS=4")
        out[name] = value
    return out


_SERVICE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def parse_services(values: Sequence[str]) -> dict[str, int]:
    """``--service web=8080`` (repeatable) -> ``{"web": 8080}``."""
    out: dict[str, int] = {}
    for raw in values:
        name, sep, port = raw.partition("=")
        if not sep or not _SERVICE_RE.match(name) or not port.isdigit():
            raise ArgumentError(
                f"--service {raw!r}: expected NAME=PORT (NAME: lower-case letters, digits,"
                " '_'), e.g. --service web=8080"
            )
        if name in out:
            raise ArgumentError(f"--service {raw!r}: the service {name!r} is given twice")
        out[name] = int(port)
    return out
