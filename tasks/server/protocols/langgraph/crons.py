"""``/lg`` crons: a cron is a schedule (``AgentClient.create_schedule``) of the key's user
that sends the cron's input (its last human message) to a thread at each tick, as a run.

A cron of a thread (``create_for_thread``) sends to that thread. A cron without one
(``create``) runs on a thread of its own, made with it and kept (``on_run_completed``
``"keep"``; ``"delete"``, a new thread per run, is refused). ``multitask_strategy``:
``"reject"`` (the default: a tick whose run still goes is skipped) or ``"enqueue"``. The
schedule's payload keeps what the protocol reads back (``lg``)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response

from config.agents import DEFAULT_AGENT
from state.documents.codec import Document
from state.errors import BadInputError
from state.lifecycle.rows import delete_sessions, in_batch
from state.sessions.rows import insert_session
from tasks.server.protocols.langgraph import shapes
from tasks.server.protocols.langgraph.common import (
    ANY,
    agent_named,
    body,
    caller_of,
    client_of,
    owner,
    session_of,
)
from tasks.server.protocols.langgraph.runs import input_text

router = APIRouter()
LG = "lg"  # the schedule payload's key for the cron as the protocol reads it back
CRON_FIELDS: dict[str, Any] = {
    "assistant_id": ANY,
    "schedule": ANY,
    "input": ANY,
    "metadata": ANY,
    "timezone": ANY,
    "multitask_strategy": ANY,
    "enabled": True,
    "config": {},
    "context": {},
    "stream_subgraphs": False,
    "durability": ANY,
}
OVERLAP = {"reject": "skip", "enqueue": "enqueue"}


@router.post("/threads/{thread_id}/runs/crons")
async def create_for_thread(request: Request, thread_id: str) -> Document:
    query = await body(request, {**CRON_FIELDS, "stream_mode": ANY})
    session = await session_of(request, thread_id)
    agent = await agent_named(request, _assistant(query))
    if str(agent["name"]) != str(session.get("agent") or DEFAULT_AGENT):
        raise HTTPException(422, "field 'assistant_id' must name the thread's own assistant")
    return await _create(request, query, str(session["session_id"]), str(session["user_id"]))


@router.post("/runs/crons")
async def create(request: Request) -> Document:
    query = await body(request, {**CRON_FIELDS, "stream_mode": ANY, "on_run_completed": "keep"})
    agent = await agent_named(request, _assistant(query))
    user, thread_id = owner(request), str(uuid.uuid4())
    _check(query)
    engine = request.app.state.parent.state.backend.engine
    name = str(agent["name"])

    def made() -> None:
        with engine.begin() as conn:
            insert_session(conn, thread_id, user, agent=None if name == DEFAULT_AGENT else name)

    def unmade() -> None:
        in_batch(engine, lambda conn: delete_sessions(conn, [thread_id]))

    await asyncio.to_thread(made)
    try:
        return await _create(request, query, thread_id, user)
    except HTTPException:
        await asyncio.to_thread(unmade)  # refused: the thread made for it goes too
        raise


def _assistant(query: Document) -> str:
    assistant = query.get("assistant_id")
    if not isinstance(assistant, str):
        raise HTTPException(422, "field 'assistant_id' is required")
    return assistant


def _check(query: Document) -> tuple[str, str, str]:
    """The cron's schedule, message and overlap; 422 naming the field otherwise."""
    schedule = query.get("schedule")
    if not isinstance(schedule, str):
        raise HTTPException(422, "field 'schedule' (five cron fields) is required")
    strategy = query.get("multitask_strategy") or "reject"
    if strategy not in OVERLAP:
        raise HTTPException(422, "field 'multitask_strategy' must be 'reject' or 'enqueue'")
    metadata = query.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise HTTPException(422, "field 'metadata' must be an object")
    return schedule, input_text(query.get("input")), OVERLAP[strategy]


async def _create(request: Request, query: Document, thread_id: str, user: str) -> Document:
    schedule, text, overlap = _check(query)
    assistant = shapes.assistant_id(str((await agent_named(request, _assistant(query)))["name"]))
    cron_id = str(uuid.uuid4())
    kept = {"assistant_id": assistant, "input": query.get("input"),
            "metadata": query.get("metadata") or {}}  # fmt: skip
    try:
        made = await client_of(request).create_schedule(
            cron_id, schedule, user_id=user, session_id=thread_id, text=text,
            timezone=query.get("timezone") or "UTC", overlap=overlap, payload={LG: kept},
        )  # fmt: skip
    except BadInputError as exc:
        raise HTTPException(422, f"field 'schedule' or 'timezone': {exc}") from None
    return cron(made)


def cron(schedule: Document) -> Document:
    """A schedule made here as a Cron."""
    kept = schedule["payload"][LG]
    return {
        "cron_id": schedule["schedule_id"],
        "assistant_id": kept["assistant_id"],
        "thread_id": schedule["session_id"],
        "on_run_completed": None,
        "end_time": None,
        "schedule": schedule["cron"],
        "timezone": schedule["timezone"],
        "created_at": schedule["created_at"],
        "updated_at": schedule["created_at"],
        "payload": {"assistant_id": kept["assistant_id"], "input": kept["input"]},
        "user_id": schedule["user_id"],
        "next_run_date": schedule["next_tick"],
        "metadata": kept["metadata"],
        "enabled": not schedule["paused"],
    }


async def _crons(request: Request) -> list[Document]:
    found = await client_of(request).list_schedules(user_id=caller_of(request).user_id)
    return [cron(s) for s in found if isinstance(s.get("payload"), dict) and LG in s["payload"]]


@router.post("/runs/crons/search")
async def search(request: Request) -> list[Document]:
    query = await body(
        request,
        {"assistant_id": ANY, "thread_id": ANY, "enabled": ANY, "limit": ANY, "offset": ANY,
         "metadata": ANY, "sort_by": ANY, "sort_order": ANY, "select": None},
    )  # fmt: skip
    found = await _crons(request)
    if query.get("assistant_id"):
        wanted = {query["assistant_id"], shapes.assistant_id(str(query["assistant_id"]))}
        found = [c for c in found if c["assistant_id"] in wanted]
    if query.get("thread_id"):
        found = [c for c in found if c["thread_id"] == query["thread_id"]]
    if query.get("enabled") is not None:
        found = [c for c in found if c["enabled"] == query["enabled"]]
    for key, value in (query.get("metadata") or {}).items():
        found = [c for c in found if c["metadata"].get(key) == value]
    limit, offset = query.get("limit", 10), query.get("offset", 0)
    if not isinstance(limit, int) or not isinstance(offset, int) or limit < 1 or offset < 0:
        raise HTTPException(422, "fields 'limit' and 'offset' must be whole numbers")
    return found[offset : offset + limit]


@router.delete("/runs/crons/{cron_id}", status_code=204)
async def delete(request: Request, cron_id: str) -> Response:
    if cron_id not in {c["cron_id"] for c in await _crons(request)}:
        raise HTTPException(404, "Cron not found")
    await client_of(request).delete_schedule(cron_id, user_id=caller_of(request).user_id)
    return Response(status_code=204)
