"""What the ``/lg`` routes share: the caller, bodies checked field by field, a thread read
as its owner sees it, the assistants."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request

from config.agents import DEFAULT_AGENT
from state.documents.codec import Document
from state.errors import InvalidIdError
from state.ids import validate_id
from tasks.client.aio import AsyncAgentClient
from tasks.server.auth import Caller
from tasks.server.protocols.langgraph import shapes

OPERATOR_THREADS = "operator"  # the owner of threads an operator key creates


def client_of(request: Request) -> AsyncAgentClient:
    client: AsyncAgentClient = request.app.state.parent.state.client
    return client


def caller_of(request: Request) -> Caller:
    caller: Caller = request.state.caller
    return caller


def owner(request: Request) -> str:
    """The user new threads of this caller belong to."""
    return caller_of(request).user_id or OPERATOR_THREADS


async def body(request: Request, allowed: dict[str, Any]) -> Document:
    """The JSON object body; a field not in ``allowed`` (or, where ``allowed`` names a
    value, with another value) answers 422 naming it: never dropped silently."""
    raw = await request.body()
    try:
        payload = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise HTTPException(422, "the body is not JSON") from None
    if not isinstance(payload, dict):
        raise HTTPException(422, "the body must be a JSON object")
    for name, value in payload.items():
        if name not in allowed:
            raise HTTPException(422, f"field {name!r} is not supported by this server")
        wanted = allowed[name]
        if wanted is not ANY and value is not None and value != wanted:
            raise HTTPException(
                422, f"field {name!r} is only supported as {json.dumps(wanted)} here"
            )
    return payload


ANY = object()


def thread_id_of(value: str) -> str:
    try:
        validate_id(value, "thread")
    except InvalidIdError:
        raise HTTPException(404, "Thread not found") from None
    return value


async def session_of(request: Request, thread_id: str) -> Document:
    """The session as the caller may see it; 404 if unknown or another user's."""
    thread_id = thread_id_of(thread_id)
    session = await client_of(request).get_session(thread_id, user_id=caller_of(request).user_id)
    if session is None:
        raise HTTPException(404, "Thread not found")
    return session


async def pending_of(request: Request, session: Document) -> list[Document]:
    """The session's pending approvals."""
    if shapes.thread_status(session) != "interrupted":
        return []
    found = await client_of(request).approvals(user_id=str(session["user_id"]), pending=True)
    return [a for a in found if a.get("session_id") == session["session_id"]]


async def agents(request: Request) -> list[Document]:
    return await client_of(request).list_agents()


async def agent_named(request: Request, assistant: str) -> Document:
    """The agent an assistant id (or graph name) names; 404 if none."""
    for agent in await agents(request):
        if assistant in (agent["name"], shapes.assistant_id(str(agent["name"]))):
            return agent
    raise HTTPException(404, f"Assistant {assistant!r} not found")


async def kind_of_session(request: Request, session: Document) -> str:
    name = str(session.get("agent") or DEFAULT_AGENT)
    for agent in await agents(request):
        if agent["name"] == name:
            return str(agent["kind"])
    return "phases"
