"""Errors the manager's services raise for the API layer to turn into problem+json.

The services do not import the HTTP layer; ``accelshare.api`` maps each
:class:`ManagerError` kind to its status (400, 403, 404, 409, 412, 503) and keeps
``field`` / ``expected`` / ``received`` so the problem names the value at fault.

    ManagerError
     ├── InvalidRequest      400  a bad value (names field, expected, received)
     ├── PermissionDenied    403
     ├── NotFound            404  (also: someone else's session, so ids do not leak)
     ├── Conflict            409  e.g. a session name already in use
     ├── LimitExceeded       412  pending-queue limits of the keypair's policy
     ├── TooLarge            413  a file over the agent's upload limit
     └── Unavailable         503  an agent that cannot be reached
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Conflict",
    "InvalidRequest",
    "LimitExceeded",
    "ManagerError",
    "NotFound",
    "PermissionDenied",
    "TooLarge",
    "Unavailable",
]


class ManagerError(Exception):
    status = 500

    def __init__(
        self,
        detail: str,
        *,
        field: str | None = None,
        expected: str | None = None,
        received: Any = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.expected = expected
        self.received = received
        self.extra = extra


class InvalidRequest(ManagerError):
    status = 400


class PermissionDenied(ManagerError):
    status = 403


class NotFound(ManagerError):
    status = 404


class Conflict(ManagerError):
    status = 409


class LimitExceeded(ManagerError):
    status = 412


class TooLarge(ManagerError):
    status = 413


class Unavailable(ManagerError):
    status = 503
