"""LangGraph's Agent Server protocol at ``/lg`` (what ``langgraph-sdk`` calls): a FastAPI
application of its own, mounted on ``agentstate serve``, with the protocol's error shape
(``{"detail": ...}``) and its keys (``x-api-key`` or ``Authorization: Bearer``, from the
same AGENTSTATE_API_KEYS). A projection over the client and the event log: threads are
sessions, runs are turns, interrupts are approvals (``shapes``).

Served: ``GET /ok``, ``GET /info``; assistants (search, get); threads (create with
``if_exists``, get, delete, search, state, ``update_state``, history); runs (create, wait,
stream, get, list, join, join_stream resumable with ``Last-Event-ID``, cancel with
``action=interrupt|rollback``); crons (create, create for a thread, search, delete: the
key's user's schedules). A request field the server does not honour answers 422
naming it.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import HTTPException, RequestValidationError
from fastapi.responses import JSONResponse

from state.errors import (
    AgentStateError,
    BadInputError,
    NotFoundError,
    RunStateError,
    SessionBusyError,
    UnauthorizedError,
)
from tasks.server.auth import Caller, KeyTable
from tasks.server.protocols.langgraph import crons, runs, streams, threads

PREFIX = "/lg"
VERSION = "0.4"  # the Agent Server API this serves


async def lg_caller(request: Request) -> Caller:
    """``x-api-key`` or ``Authorization: Bearer``; the caller is kept on the request."""
    table: KeyTable = request.app.state.keys
    presented = request.headers.get("x-api-key")
    if presented is None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else None
    caller = table.caller(presented)
    request.state.caller = caller
    return caller


def _detail(status: int, detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


# Each error as the protocol answers it (first match), ``{"detail": ...}``.
_STATUSES: list[tuple[type[Exception], int, str | None]] = [
    (UnauthorizedError, 401, "a valid x-api-key or Authorization: Bearer key is required"),
    (
        SessionBusyError,
        409,
        "Thread is already running a task. Wait for it to finish or choose a different "
        "multitask strategy.",
    ),
    (NotFoundError, 404, "Thread not found"),
    (RunStateError, 409, None),
    (BadInputError, 422, None),
]


async def _error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, HTTPException):
        return _detail(exc.status_code, exc.detail)
    if isinstance(exc, RequestValidationError):
        return _detail(422, "the request does not match the protocol")
    for kind, status, detail in _STATUSES:
        if isinstance(exc, kind):
            return _detail(status, detail or str(exc))
    return _detail(500, "internal error (see the server's log)")


def build_app(parent: FastAPI) -> FastAPI:
    """The ``/lg`` application, sharing ``parent``'s client, backend and keys."""
    app = FastAPI(
        title="agentstate: LangGraph Agent Server protocol",
        dependencies=[Depends(lg_caller)],
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.keys = parent.state.keys
    app.state.parent = parent
    for error in (HTTPException, RequestValidationError, AgentStateError):
        app.add_exception_handler(error, _error)

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return {
            "version": VERSION,
            "langgraph_py_version": None,
            "flags": {"assistants": True, "crons": True, "langsmith": False},
            "host": {"kind": "agentstate"},
        }

    app.include_router(threads.router)
    app.include_router(runs.router)
    app.include_router(streams.router)
    app.include_router(crons.router)
    return app
