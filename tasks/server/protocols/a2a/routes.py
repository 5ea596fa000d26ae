"""A2A 1.0's JSON-RPC binding at ``POST /a2a/{agent}`` (the same keys as ``/v1``), and the
agents' public cards: ``/.well-known/agent-card.json`` (the default agent) and
``/a2a/{agent}/.well-known/agent-card.json``.

The SDK's dispatcher speaks the protocol (envelope, ``A2A-Version``, errors, SSE); the
key is checked before it reads the body, and the caller travels to the handler in the
call context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder, ServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.types import Receive, Scope, Send

from config import Settings
from config.agents import DEFAULT_AGENT
from tasks.server.context import Client, Config, Who
from tasks.server.protocols.a2a.handler import AgentstateHandler
from tasks.server.protocols.a2a.tasks import Door
from tasks.server.protocols.agents import require_agent
from tasks.server.sse import StreamSlots

rpc_router = APIRouter(tags=["a2a"])
_STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})
card_router = APIRouter(tags=["a2a"])
_DOOR = "agentstate.door"


class _WithDoor(ServerCallContextBuilder):
    """The SDK's context, plus who calls which agent (set by the route)."""

    def __init__(self) -> None:
        self.default = DefaultServerCallContextBuilder()

    def build(self, request: Any) -> ServerCallContext:
        context = self.default.build(request)
        context.state[_DOOR] = request.scope[_DOOR]
        return context


_dispatcher = JsonRpcDispatcher(request_handler=AgentstateHandler(), context_builder=_WithDoor())


@rpc_router.post("/a2a/{agent}", include_in_schema=False)
async def rpc(agent: str, request: Request, who: Who, client: Client, settings: Config) -> Response:
    require_agent(settings, agent)
    request.scope[_DOOR] = Door(client, request.app.state.backend.engine, settings, who, agent)
    release = await _stream_slot(request)
    try:
        answer: Response = await _dispatcher.handle_requests(request)
    except BaseException:
        release()
        raise
    if not isinstance(answer, EventSourceResponse):
        release()
        return answer
    return _Releasing(answer, release)


async def _stream_slot(request: Request) -> Callable[[], None]:
    """A slot of AGENTSTATE_MAX_STREAMS for a streaming method (a no-op release for the
    others): an A2A stream counts as any other event stream of the process."""
    try:
        body = await request.json()  # kept by the request: the dispatcher reads it again
    except ValueError:
        body = None
    method = body.get("method") if isinstance(body, dict) else None
    if method not in _STREAMING:
        return lambda: None
    slots: StreamSlots = request.app.state.streams
    return slots.take()


class _Releasing(Response):
    """A streamed answer that gives its slot back once it ends, however it ends."""

    def __init__(self, inner: Response, release: Callable[[], None]) -> None:
        super().__init__(status_code=inner.status_code)
        self.inner = inner
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.release()


def card(settings: Settings, agent: str, base_url: str, version: str) -> pb.AgentCard:
    """The public card of ``agent``: where to call it, and how to authenticate."""
    public = settings.public_url or base_url
    made = pb.AgentCard(
        name=agent,
        description=f"agentstate agent {agent!r}: a message in, the agent's reply out; each "
        "message is a task (a turn), each context a session.",
        version=version,
        supported_interfaces=[
            pb.AgentInterface(
                url=f"{str(public).rstrip('/')}/a2a/{agent}",
                protocol_binding="JSONRPC",
                protocol_version=PROTOCOL_VERSION_1_0,
            )
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[
            pb.AgentSkill(
                id="chat",
                name="chat",
                description="Answers a message; may ask a person to approve an action "
                "first (the task is then input-required).",
                tags=["chat"],
            )
        ],
    )
    made.security_schemes["bearer"].http_auth_security_scheme.scheme = "bearer"
    requirement = made.security_requirements.add()
    requirement.schemes["bearer"].list[:] = []
    return made


def _card_answer(request: Request, settings: Settings, agent: str) -> JSONResponse:
    require_agent(settings, agent)
    version = str(request.app.version)
    shown = card(settings, agent, str(request.base_url), version)
    return JSONResponse(agent_card_to_dict(shown))


@card_router.get(AGENT_CARD_WELL_KNOWN_PATH, include_in_schema=False)
async def default_card(request: Request, settings: Config) -> JSONResponse:
    return _card_answer(request, settings, DEFAULT_AGENT)


@card_router.get(f"/a2a/{{agent}}{AGENT_CARD_WELL_KNOWN_PATH}", include_in_schema=False)
async def agent_card(agent: str, request: Request, settings: Config) -> JSONResponse:
    return _card_answer(request, settings, agent)
