"""The HTTP service: ``create_app()`` builds the ASGI app ``agentstate serve`` runs.

JSON over HTTP under ``/v1`` (the OpenAPI document is at ``/openapi.json``), health at
``/healthz`` and ``/readyz``, and the console at ``/``: static files of this package,
talking to the same API. Nothing here runs an agent: like any app, the service only
sends and reads through the client (``tasks.server.backend``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import Route

from config import Settings, get_settings
from state.gauges import waiting
from state.storage.backend import Backend
from tasks.cli.support import DISTRIBUTION
from tasks.client.aio import AsyncAgentClient
from tasks.observability.metrics import serve_registry
from tasks.server import errors
from tasks.server.auth import KeyTable, caller
from tasks.server.backend import open_client
from tasks.server.gate import Gate
from tasks.server.guards import BodyLimit, SecurityHeaders, TimeLimit
from tasks.server.models import ErrorOut
from tasks.server.protocols import langgraph as langgraph_protocol
from tasks.server.protocols.a2a import routes as a2a_routes
from tasks.server.protocols.agui import routes as agui_routes
from tasks.server.protocols.mcp import door as mcp_door
from tasks.server.queries import known_query_parameters
from tasks.server.routes import (
    agents,
    approvals,
    health,
    schedules,
    sessions,
    users,
    webhooks,
    workflows,
)
from tasks.server.sse import StreamSlots

CONSOLE = Path(__file__).resolve().parent / "console"
KEY = Depends(caller)
QUERY = Depends(known_query_parameters)

# Every /v1 route may answer these (the OpenAPI document lists them per route).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in {
        400: "bad input; nothing was changed",
        401: "no valid Authorization: Bearer key",
        404: "unknown id (or another user's)",
        409: "conflicts with what is stored; nothing was changed",
        413: "too large; nothing was changed",
        429: "too many wrong keys from this address, or too many streams of this key; "
        "retry after Retry-After seconds",
        422: "the request does not match this document; nothing was changed",
        503: "a service did not answer, or no answer in time; retry",
    }.items()
}


def _version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0"


def create_app(settings: Settings | None = None, client: AsyncAgentClient | None = None) -> FastAPI:
    """The service for ``settings`` (default: the environment's)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        app.state.draining = anyio.Event()
        async with mcp_door.running(app.state.mcp):
            yield
        await app.state.client.aclose()

    app = FastAPI(
        title="agentstate",
        version=_version(),
        summary="Durable state for AI agents on Celery: sessions, workflows, approvals.",
        description=(
            "Every `/v1` route needs `Authorization: Bearer KEY` when AGENTSTATE_API_KEYS is "
            "set. A user's key reaches only that user's sessions, workflows and approvals; "
            "anything else answers 404, exactly as an unknown id does. Errors are "
            '`{"error": "one line", "kind": "..."}`.'
        ),
        openapi_url="/openapi.json",
        docs_url=None,  # Swagger UI and ReDoc load from CDNs: the console is ours
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.keys = KeyTable(settings.api_key_users)
    app.state.streams = StreamSlots(settings.max_streams, settings.max_streams_per_key)
    app.state.client = client or open_client(settings)
    app.state.backend = Backend.build(settings)
    engine = app.state.backend.engine
    app.state.metrics = serve_registry(lambda: waiting(engine), app.state.backend.redis)
    errors.install(app)
    app.include_router(health.router)
    for module in (sessions, workflows, approvals, users, schedules, webhooks, agents):
        # Every /v1 route needs a key, whether or not it asks who is calling.
        app.include_router(module.router, responses=ERROR_RESPONSES, dependencies=[KEY, QUERY])
    # LangGraph's Agent Server protocol, with its own error shape and key headers.
    app.mount(langgraph_protocol.PREFIX, langgraph_protocol.build_app(app))
    # The protocols' doors: the same keys as /v1 (their own documents describe them).
    app.include_router(agui_routes.router, dependencies=[KEY, QUERY])
    app.include_router(a2a_routes.rpc_router, dependencies=[KEY, QUERY])
    app.include_router(a2a_routes.card_router)  # agent cards are public
    app.state.mcp = mcp_door.build(_version())
    door = mcp_door.McpDoor(app.state.mcp, app.state.keys)
    app.router.routes.append(Route(mcp_door.PATH, door, methods=["GET", "POST", "DELETE"]))
    _add_console(app)
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    app.add_middleware(TimeLimit, seconds=settings.request_time_limit)
    # Before the body is read, and under any ASGI server (tasks.server.gate).
    app.add_middleware(Gate, keys=app.state.keys, bad_key_limit=settings.http_bad_key_limit)
    app.add_middleware(SecurityHeaders)  # outermost: every answer has them
    return app


def _add_console(app: FastAPI) -> None:
    index = CONSOLE / "index.html"

    @app.get("/", include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(index, media_type="text/html")

    app.mount("/console", StaticFiles(directory=CONSOLE), name="console")


def drain(app: FastAPI) -> None:
    """Ask every open event stream to end now (the server is shutting down). Safe to call
    from a signal handler or another thread."""
    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(app.state.draining.set)
