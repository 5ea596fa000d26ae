"""``/mcp``: the MCP SDK's Streamable HTTP transport (stateless, JSON answers), behind the
service's keys: a request without a valid ``Authorization: Bearer`` key answers 401 before
its body is read, and the key's user travels to the tools with the request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from state.errors import UnauthorizedError
from tasks.server.auth import Caller, KeyTable
from tasks.server.errors import error_response
from tasks.server.protocols.mcp import task_calls, tools
from tasks.server.protocols.mcp.tools import Call

PATH = "/mcp"
_CALLER = "agentstate.caller"


def _call_of(context: Any) -> Call:
    return _call_in(context.request.scope)


def _call_in(scope: Scope) -> Call:
    app = scope["app"]
    return Call(app.state.client, app.state.backend.engine, app.state.settings, scope[_CALLER])


async def _list_tools(
    context: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=await tools.tools(_call_of(context)))


async def _call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return await tools.call_tool(_call_of(context), params.name, dict(params.arguments or {}))


class _TaskServer(Server[Any]):
    """The SDK's server, saying it runs ``tools/call`` as tasks (``tasks`` capability of
    revision 2025-11-25; the SDK has the types but no server side of its own)."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        found = super().get_capabilities(*args, **kwargs)
        found.tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return found


def build(version: str) -> StreamableHTTPSessionManager:
    """The transport of one app (its ``run()`` is entered by the app's lifespan)."""
    server: Server[Any] = _TaskServer(
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
        if scope.get("method") != "POST":
            await self.manager.handle_request(scope, receive, send)
            return
        body = await _body(receive)
        answer = await _task_call(scope, body)
        if answer is not None:
            await answer(scope, receive, send)
            return
        await self.manager.handle_request(scope, _replay(body, receive), send)


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The request's body once more (read already), then the connection's own messages."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _task_call(scope: Scope, body: bytes) -> JSONResponse | None:
    """A Tasks request answered here (None: anything else, for the SDK). mcp 2.3.0's
    server checks a ``tools/call`` answer as a ``CallToolResult`` (a ``CreateTaskResult``
    cannot pass) and drops a task's ``ttl`` when it is null (unlimited), which the schema
    requires; so the Tasks methods of revision 2025-11-25 are served beside it."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    method, params = request.get("method"), request.get("params")
    if not task_calls.is_task_request(method, params):
        return None
    envelope: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
    try:
        envelope["result"] = await task_calls.answer(_call_in(scope), str(method), params)
    except MCPError as exc:
        envelope["error"] = {"code": exc.error.code, "message": exc.error.message}
    return JSONResponse(envelope)


@asynccontextmanager
async def running(manager: StreamableHTTPSessionManager) -> AsyncIterator[None]:
    async with manager.run():
        yield
