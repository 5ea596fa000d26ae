"""``/mcp``: the MCP SDK's Streamable HTTP transport (stateless, JSON answers), behind the
service's keys: a request without a valid ``Authorization: Bearer`` key answers 401 before
its body is read, and the key's user travels to the tools with the request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from state.errors import UnauthorizedError
from tasks.server.auth import Caller, KeyTable
from tasks.server.errors import error_response
from tasks.server.protocols.mcp import tools
from tasks.server.protocols.mcp.tools import Call

PATH = "/mcp"
_CALLER = "agentstate.caller"


def _call_of(context: Any) -> Call:
    request = context.request
    app = request.scope["app"]
    return Call(
        app.state.client, app.state.backend.engine, app.state.settings, request.scope[_CALLER]
    )


async def _list_tools(
    context: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=await tools.tools(_call_of(context)))


async def _call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return await tools.call_tool(_call_of(context), params.name, dict(params.arguments or {}))


def build(version: str) -> StreamableHTTPSessionManager:
    """The transport of one app (its ``run()`` is entered by the app's lifespan)."""
    server: Server[Any] = Server(
        "agentstate",
        version=version,
        instructions="Each ask_{agent} tool talks to an agent of this deployment (pass "
        "session_id to continue a conversation); each other tool runs a workflow action.",
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )
    return StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)


class McpDoor:
    """The ASGI app mounted at ``/mcp``: the key first, then the transport."""

    def __init__(self, manager: StreamableHTTPSessionManager, keys: KeyTable) -> None:
        self.manager = manager
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        presented = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                text = value.decode("latin-1")
                if text[:7].lower() == "bearer ":
                    presented = text[7:].strip()
        try:
            who: Caller = self.keys.caller(presented)
        except UnauthorizedError as exc:
            await error_response(401, "unauthorized", str(exc))(scope, receive, send)
            return
        scope[_CALLER] = who
        await self.manager.handle_request(scope, receive, send)


@asynccontextmanager
async def running(manager: StreamableHTTPSessionManager) -> AsyncIterator[None]:
    async with manager.run():
        yield
