"""Rules for text taken from users at the boundary (pure, no I/O).

Every text a request hands to the manager ends up somewhere that cannot hold what a
JSON string can: a NUL byte cannot be in a process's argv or environment (the session
would fail to start), a control character in a name or an e-mail address makes two
addresses look alike in every listing.  So:

* **single-line text** (names, e-mail addresses, environment variable names): no
  control character at all (C0 ``U+0000``-``U+001F``, ``DEL`` ``U+007F``, C1
  ``U+0080``-``U+009F``);
* **multi-line text** (a startup command, an environment variable's value): the same,
  except tab, line feed and carriage return;
* **environment variable names** are POSIX names, ``[A-Za-z_][A-Za-z0-9_]*``;
* **the accelerators' variables are the agent's**: a request cannot set
  ``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``, ``CUDA_MPS_*``, the
  ``BACKENDAI_*`` variables (except ``BACKENDAI_SERVICE_PORT_<NAME>``, how a session
  declares its app services) nor the ``ACCELSHARE_*`` ones: they would reach devices
  the session was not given (:func:`reserved_env_reason`).

Each check raises :class:`~accelshare.common.errors.CommonValueError` naming the field,
what was expected and what was received.
"""

from __future__ import annotations

import re

from .errors import CommonValueError

__all__ = [
    "ENV_NAME_EXPECTED",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "check_env_name",
    "check_text",
    "find_control",
    "reserved_env_reason",
]

#: Tab, line feed and carriage return: allowed in multi-line text only.
_LINE_CONTROLS = frozenset("\t\n\r")

ENV_NAME_EXPECTED = "a POSIX variable name: [A-Za-z_][A-Za-z0-9_]*"
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Variables the agent sets for a kernel's devices (exact names).
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
#: Prefixes of the agent's variables: MPS (enforced GPU fractions), Backend.AI's
#: resource and mock-device variables, accelshare's own (resource.txt, ids).
RESERVED_ENV_PREFIXES = ("CUDA_MPS_", "BACKENDAI_", "ACCELSHARE_")
#: ``BACKENDAI_SERVICE_PORT_<NAME>``: declared by the session's creator (app services).
_ALLOWED_PREFIX = "BACKENDAI_SERVICE_PORT_"


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F


def find_control(text: str, *, multiline: bool = False) -> int | None:
    """The index of the first control character ``text`` must not hold, or None.

    >>> find_control("a\\x00b"), find_control("a\\nb"), find_control("a\\nb", multiline=True)
    (1, 1, None)
    """
    for index, char in enumerate(text):
        if _is_control(char) and not (multiline and char in _LINE_CONTROLS):
            return index
    return None


def check_text(text: str, *, field: str, multiline: bool = False) -> str:
    """``text`` unchanged, or :class:`CommonValueError` naming the character and where."""
    index = find_control(text, multiline=multiline)
    if index is None:
        return text
    allowed = " (tab, line feed and carriage return are allowed)" if multiline else ""
    expected = f"text without NUL or control characters{allowed}"
    raise CommonValueError(
        f"{field} holds the control character U+{ord(text[index]):04X} at position {index}:"
        f" expected {expected}",
        field=field,
        expected=expected,
        received=text,
    )


def reserved_env_reason(name: str) -> str | None:
    """Why a request may not set the variable ``name`` (None: it may).

    >>> reserved_env_reason("CUDA_VISIBLE_DEVICES") is not None
    True
    >>> reserved_env_reason("BACKENDAI_SERVICE_PORT_WEB") is None
    True
    """
    if name in RESERVED_ENV_NAMES:
        return f"{name} is set by the agent: it names the devices allocated to the session"
    for prefix in RESERVED_ENV_PREFIXES:
        if name.startswith(prefix) and not name.startswith(_ALLOWED_PREFIX):
            return (
                f"{name} is set by the agent ({prefix}* variables describe the session's"
                " allocation and devices)"
            )
    return None


def check_env_name(name: str, *, field: str) -> str:
    """``name`` unchanged when a request may set it; :class:`CommonValueError` otherwise
    (not a POSIX name, or one of the agent's variables)."""
    if not _ENV_NAME_RE.fullmatch(name):
        raise CommonValueError(
            f"{field}: {name!r} is not an environment variable name: expected {ENV_NAME_EXPECTED}",
            field=field,
            expected=ENV_NAME_EXPECTED,
            received=name,
        )
    reason = reserved_env_reason(name)
    if reason is not None:
        expected = (
            "a variable the agent does not set (not CUDA_VISIBLE_DEVICES,"
            " NVIDIA_VISIBLE_DEVICES, CUDA_MPS_*, BACKENDAI_* but BACKENDAI_SERVICE_PORT_*,"
            " ACCELSHARE_*)"
        )
        raise CommonValueError(
            f"{field}: {reason}; a request cannot set it",
            field=field,
            expected=expected,
            received=name,
        )
    return name
