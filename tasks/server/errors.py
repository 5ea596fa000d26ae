"""How a failure answers over HTTP: ``{"error": "one line", "kind": "..."}`` with the status
its error class maps to, as the CLI's kinds map to exit statuses.

Bad input is a 4xx and changes nothing (400, 413 for what is too large, 422 for a request
that does not match the OpenAPI document); an unknown id, or another user's, is 404; a
conflict with what is stored (an idempotency key reused for other text, a decided
approval, a finished workflow, state a newer version stored) is 409; a service that does
not answer is 503. Only a bug is a 500, and its answer says nothing of it (the traceback
goes to the log).
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException

from config.urls import scrub
from state.errors import (
    AgentStateError,
    BadInputError,
    DatabaseNotFoundError,
    ForbiddenError,
    FutureVersionError,
    IdempotencyConflictError,
    MessageTooLargeError,
    NotFoundError,
    RequestTooLargeError,
    RunStateError,
    ServiceUnavailableError,
    SessionExistsError,
    SessionOwnershipError,
    StaleStateError,
    StateLockAcquisitionError,
    TooManyRequestsError,
    UnauthorizedError,
    UserStateTooLargeError,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"

# The first row an exception is an instance of says how it answers (subclasses first).
_RULES: list[tuple[tuple[type[Exception], ...], int, str]] = [
    ((UnauthorizedError,), 401, "unauthorized"),
    ((ForbiddenError,), 403, "forbidden"),
    ((TooManyRequestsError,), 429, "rate_limited"),
    ((DatabaseNotFoundError,), 503, "unavailable"),  # the server's setup, not the caller's
    ((NotFoundError, SessionOwnershipError), 404, "not_found"),
    ((RequestTooLargeError, MessageTooLargeError, UserStateTooLargeError), 413, "bad_input"),
    ((IdempotencyConflictError, RunStateError, SessionExistsError), 409, "conflict"),
    # Stored by a newer agentstate: left as is until this server is upgraded.
    ((FutureVersionError,), 409, "conflict"),
    ((BadInputError,), 400, "bad_input"),
    ((StaleStateError,), 409, "conflict"),
    ((TimeoutError,), 503, "timeout"),
    (
        (
            redis.RedisError,
            BrokerError,
            OperationalError,
            InterfaceError,
            ServiceUnavailableError,
            StateLockAcquisitionError,
        ),
        503,
        "unavailable",
    ),
]


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and kind of ``exc`` (500 ``failure`` for anything unexpected)."""
    for types, status, kind in _RULES:
        if isinstance(exc, types):
            return status, kind
    return 500, "failure"


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    """The one shape of every error answer."""
    lines = scrub(message).strip().splitlines()
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status in (429, 503):
        headers["Retry-After"] = RETRY_AFTER_S
    body = {"error": lines[0] if lines else kind, "kind": kind}
    return JSONResponse(body, status_code=status, headers=headers)


async def _agentstate_error(request: Request, exc: Exception) -> JSONResponse:
    status, kind = status_of(exc)
    if status == 500:
        logger.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, kind, "internal error (see the server's log)")
    if isinstance(exc, SessionOwnershipError):
        # Another user's session answers as an unknown one: nothing says it exists.
        return error_response(status, kind, "unknown session")
    service = unreachable(exc)
    if service is not None:
        # The driver's text names hosts, ports and SQL: the log has it, the answer not.
        logger.warning("%s %s: %s unreachable: %s", request.method, request.url.path, service, exc)
        return error_response(status, kind, f"cannot reach {service}; retry (see the server's log)")
    return error_response(status, kind, str(exc))


def unreachable(exc: BaseException) -> str | None:
    """The service a connection failure is of (None: it is not one)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return "the database"
    if isinstance(exc, redis.RedisError):
        return "Redis"
    if isinstance(exc, BrokerError):
        return "the broker"
    return None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors: list[Any] = list(exc.errors())
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        # pydantic's words would be "0: JSON decode error": say what and where.
        detail = (first.get("ctx") or {}).get("error", "not JSON")
        position = first.get("loc", ("body", 0))[-1]
        return error_response(
            422, "bad_input", f"the body is not valid JSON ({detail} at character {position})"
        )
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    message = f"{where or 'request'}: {first.get('msg', 'invalid')}{more}"
    return error_response(422, "bad_input", message)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 401: "unauthorized", 403: "forbidden"}.get(
        exc.status_code, "bad_input" if exc.status_code < 500 else "failure"
    )
    response = error_response(exc.status_code, kind, str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _agentstate_error)
    for types, _, _ in _RULES:
        for error_type in types:
            app.add_exception_handler(error_type, _agentstate_error)
    app.add_exception_handler(AgentStateError, _agentstate_error)
