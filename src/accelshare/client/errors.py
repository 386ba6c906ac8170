"""Client-side errors.

ClientError
 ├── APIError          the server answered with an error (problem+json details kept)
 ├── GraphQLError      a GraphQL answer carried ``errors`` (the answer is kept)
 └── ConnectionFailed  the server could not be reached
"""

from __future__ import annotations

from typing import Any

__all__ = ["APIError", "ClientError", "ConnectionFailed", "GraphQLError"]


class ClientError(Exception):
    pass


class APIError(ClientError):
    """An HTTP error response; ``problem`` holds the RFC 9457 body when there is one."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.title = str(problem.get("title") or f"HTTP {status}")
        self.detail = str(problem.get("detail") or problem.get("msg") or "")
        super().__init__(f"{self.title}: {self.detail}" if self.detail else self.title)


class ConnectionFailed(ClientError):
    pass


class GraphQLError(ClientError):
    """``errors`` in a GraphQL answer; ``result`` is the whole answer (``data`` too)."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.errors: list[dict[str, Any]] = list(result.get("errors") or [])
        messages = "; ".join(str(e.get("message", e)) for e in self.errors)
        super().__init__(messages or "GraphQL error")
