"""RFC 9457 problem details: the one error shape of the REST API.

Every error response is ``application/problem+json``::

    {"type": "/problems/invalid-api-params", "title": "Invalid API parameters",
     "status": 400, "detail": "body.email: Field required (received: {...})",
     "field": "email", "expected": "Field required", "received": {...}}

``type`` is a relative URI ``/problems/<slug>``; Backend.AI's client matches error
kinds on the slug after the last ``/`` and prints ``title`` and ``msg``, so ``msg``
repeats ``detail``.  Extension members: ``field`` / ``expected`` / ``received`` when one
input value is at fault, ``reason`` for authentication failures, ``errors`` and
``data`` (field -> message) for validation errors.

Exception hierarchy (raise these from routes and dependencies)::

    Problem                         500 internal-server-error
     ├── BadRequest                 400 bad-request
     │    ├── InvalidAPIParameters  400 invalid-api-params
     │    └── QueryTooComplex       400 graphql-too-complex
     ├── Unauthorized               401 unauthorized     (adds WWW-Authenticate)
     ├── Forbidden                  403 forbidden
     ├── NotFound                   404 not-found
     ├── Conflict                   409 conflict
     ├── QuotaExceeded              412 quota-exceeded
     ├── TooManyRequests            429 too-many-requests (adds Retry-After)
     └── ServiceUnavailable         503 service-unavailable

The control plane's services raise ``accelshare.manager.errors.ManagerError``
(InvalidRequest 400, PermissionDenied 403, NotFound 404, Conflict 409, LimitExceeded 412,
Unavailable 503); they become the problems above with their field/expected/received.

A database that cannot be reached or dropped the connection (see
:func:`is_database_unavailable`) is a 503 ``service-unavailable`` with
``reason: "database-unavailable"`` and ``Retry-After``, not a 500: the pool replaces
dead connections, so a retry usually succeeds at once.  Any other error is a 500 whose
detail reveals nothing (the traceback goes to the log).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from accelshare.common import CommonValueError
from accelshare.manager.errors import ManagerError
from accelshare.manager.store_errors import DATABASE_ERRORS, is_database_unavailable

__all__ = [
    "DATABASE_RETRY_AFTER_S",
    "PROBLEM_MEDIA_TYPE",
    "BadRequest",
    "Conflict",
    "ContentTooLarge",
    "Forbidden",
    "InvalidAPIParameters",
    "NotFound",
    "Problem",
    "QueryTooComplex",
    "QuotaExceeded",
    "ServiceUnavailable",
    "TooManyRequests",
    "Unauthorized",
    "install_problem_handlers",
    "is_database_unavailable",
    "problem_response",
    "problem_type",
]

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
_MAX_RECEIVED_CHARS = 200


def problem_type(slug: str) -> str:
    return f"/problems/{slug}"


def _jsonable(value: Any) -> Any:
    """``value`` if it is small JSON, else a truncated ``repr`` (never fail on odd input).

    ``allow_nan=False`` as the response renders it: a received ``1e999`` or ``NaN`` (the
    JSON parser reads them as float infinity / NaN) made the 400 itself fail, a 500."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
        return text if len(text) <= _MAX_RECEIVED_CHARS else text[:_MAX_RECEIVED_CHARS] + "..."
    if len(text) <= _MAX_RECEIVED_CHARS:
        return value
    return text[:_MAX_RECEIVED_CHARS] + "..."


class Problem(Exception):
    """An error with an HTTP status that becomes a problem+json response."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal-server-error"
    title: ClassVar[str] = "Internal server error"

    def __init__(
        self,
        detail: str,
        *,
        field: str | None = None,
        expected: str | None = None,
        received: Any = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = dict(extra)
        if field is not None:
            self.extra["field"] = field
            if expected is not None:
                self.extra["expected"] = expected
            self.extra["received"] = _jsonable(received)
        self.headers = dict(headers or {})

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": problem_type(self.slug),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "msg": self.detail,
        }
        body.update(self.extra)
        return body


class BadRequest(Problem):
    status = 400
    slug = "bad-request"
    title = "Bad request"


class InvalidAPIParameters(BadRequest):
    slug = "invalid-api-params"
    title = "Invalid API parameters"


class QueryTooComplex(BadRequest):
    """A GraphQL document over a cost limit (:mod:`accelshare.api.gql_limits`)."""

    slug = "graphql-too-complex"
    title = "GraphQL query too complex"


class Unauthorized(Problem):
    status = 401
    slug = "unauthorized"
    title = "Authentication required"

    def __init__(self, detail: str, *, reason: str, **extra: Any) -> None:
        headers = {"WWW-Authenticate": 'BackendAI realm="accelshare"'}
        super().__init__(detail, reason=reason, headers=headers, **extra)
        self.reason = reason


class Forbidden(Problem):
    status = 403
    slug = "forbidden"
    title = "Forbidden"


class NotFound(Problem):
    status = 404
    slug = "not-found"
    title = "Not found"


class Conflict(Problem):
    status = 409
    slug = "conflict"
    title = "Conflict"


class QuotaExceeded(Problem):
    status = 412
    slug = "quota-exceeded"
    title = "Quota exceeded"


class ContentTooLarge(Problem):
    status = 413
    slug = "content-too-large"
    title = "Content Too Large"


class TooManyRequests(Problem):
    """Throttled (the login's failure limits): ``Retry-After`` says when to try again."""

    status = 429
    slug = "too-many-requests"
    title = "Too many requests"

    def __init__(self, detail: str, *, retry_after_s: int, **extra: Any) -> None:
        super().__init__(detail, retry_after_s=retry_after_s, **extra)
        self.headers["Retry-After"] = str(retry_after_s)


class ServiceUnavailable(Problem):
    status = 503
    slug = "service-unavailable"
    title = "Service unavailable"

    def __init__(self, detail: str, *, retry_after_s: int | None = None, **extra: Any) -> None:
        super().__init__(detail, **extra)
        if retry_after_s is not None:
            self.headers["Retry-After"] = str(retry_after_s)


class ServerFrozen(ServiceUnavailable):
    """Backend.AI's ``server-frozen``: the manager is frozen for maintenance."""

    slug = "server-frozen"
    title = "The server is frozen due to maintenance. Please try again later."


def problem_response(problem: Problem, instance: str | None = None) -> JSONResponse:
    body = problem.to_body()
    if instance is not None:
        body.setdefault("instance", instance)
    return JSONResponse(
        body, status_code=problem.status, headers=problem.headers, media_type=PROBLEM_MEDIA_TYPE
    )


def _field_name(loc: Sequence[Any]) -> tuple[str, str]:
    """FastAPI's ``("body", "config", "resources")`` -> ``("body", "config.resources")``."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "path", "header", "cookie"}:
        return parts[0], ".".join(parts[1:]) or parts[0]
    return "body", ".".join(parts)


def validation_problem(errors: Sequence[Any]) -> InvalidAPIParameters:
    """One problem naming the first bad field and value; all of them in ``errors``."""
    items: list[dict[str, Any]] = []
    for error in errors:
        location, field = _field_name(error.get("loc", ()))
        message, received = str(error.get("msg", "invalid value")), error.get("input")
        if error.get("type") == "json_invalid":  # loc is ("body", <character position>)
            reason = (error.get("ctx") or {}).get("error", "")
            message = f"The body is not valid JSON ({reason} at character {field})"
            field, received = "body", None
        items.append(
            {
                "location": location,
                "field": field,
                "message": message,
                "received": _jsonable(received),
            }
        )
    if not items:
        return InvalidAPIParameters("Invalid request")
    first = items[0]
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    detail = (
        f"Invalid value for {first['location']} field {first['field']!r}: {first['message']}"
        f" (received {json.dumps(first['received'])}){more}"
    )
    return InvalidAPIParameters(
        detail,
        field=first["field"],
        expected=first["message"],
        received=first["received"],
        errors=items,
        data={item["field"]: item["message"] for item in items},
    )


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(exc, request.url.path)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return problem_response(validation_problem(exc.errors()), request.url.path)


async def _on_common_value_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CommonValueError)
    problem = InvalidAPIParameters(
        str(exc), field=exc.field, expected=exc.expected, received=exc.received
    )
    return problem_response(problem, request.url.path)


_MANAGER_PROBLEMS: dict[int, type[Problem]] = {
    400: InvalidAPIParameters,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: QuotaExceeded,
    413: ContentTooLarge,
    503: ServiceUnavailable,
}


_SLUG_PROBLEMS: dict[str, type[Problem]] = {"server-frozen": ServerFrozen}
"""Manager errors whose ``slug`` names a problem of their own."""


async def _on_manager_error(request: Request, exc: Exception) -> JSONResponse:
    """The control plane's errors (``accelshare.manager.errors``) as problems."""
    assert isinstance(exc, ManagerError)
    kind = _SLUG_PROBLEMS.get(getattr(exc, "slug", ""), _MANAGER_PROBLEMS.get(exc.status, Problem))
    problem = kind(
        exc.detail, field=exc.field, expected=exc.expected, received=exc.received, **exc.extra
    )
    return problem_response(problem, request.url.path)


_FASTAPI_BODY_UNREADABLE = "There was an error parsing the body"


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    known: dict[int, type[Problem]] = {
        400: BadRequest,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        412: QuotaExceeded,
    }
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "Error"
    detail = str(exc.detail) if exc.detail else phrase
    kind = known.get(exc.status_code)
    body: dict[str, Any] = {
        "type": problem_type(kind.slug if kind else phrase.lower().replace(" ", "-")),
        "title": kind.title if kind else phrase,
        "status": exc.status_code,
        "detail": detail,
        "msg": detail,
        "instance": request.url.path,
    }
    if exc.status_code == 400 and detail == _FASTAPI_BODY_UNREADABLE:
        # FastAPI's answer to a body it cannot even decode (not UTF-8, say): name it
        body.update(
            detail="The body is not a JSON document in UTF-8",
            msg="The body is not a JSON document in UTF-8",
            field="body",
            expected="a JSON document in UTF-8",
        )
    return JSONResponse(
        body,
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
        media_type=PROBLEM_MEDIA_TYPE,
    )


DATABASE_RETRY_AFTER_S = 2


async def _on_backend_error(request: Request, exc: Exception) -> JSONResponse:
    """The store's errors (:data:`~accelshare.manager.store_errors.DATABASE_ERRORS`) and
    socket ``ConnectionError``: 503 when the database is
    unavailable (:func:`is_database_unavailable`); anything else goes on to the
    unexpected-error handler (500) exactly as before."""
    if not is_database_unavailable(exc):
        raise exc
    # The message names the failure, never a statement's parameters (hide_parameters).
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    log.warning(
        "the database is unavailable on %s %s: %s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
        first_line,
    )
    problem = ServiceUnavailable(
        "The database is unavailable (the connection failed, was lost or is busy);"
        f" retry in {DATABASE_RETRY_AFTER_S} s",
        retry_after_s=DATABASE_RETRY_AFTER_S,
        reason="database-unavailable",
    )
    return problem_response(problem, request.url.path)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Details stay in the log: an internal error message may hold secrets or SQL.
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        Problem("The server hit an unexpected error; see the manager log."), request.url.path
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Route every error (ours, FastAPI's validation, Starlette's 404/405) to problem+json."""
    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(CommonValueError, _on_common_value_error)
    app.add_exception_handler(ManagerError, _on_manager_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, _on_backend_error)
    app.add_exception_handler(ConnectionError, _on_backend_error)
    app.add_exception_handler(Exception, _on_unexpected)
