"""``/lg`` assistants and threads: an assistant is an agent of the deployment, a thread a
session owned by the key's user."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response

from state.documents.codec import Document
from state.lifecycle.erase import drop_keys
from state.lifecycle.rows import delete_sessions, in_batch
from state.sessions.rows import insert_session
from state.storage import keys
from tasks.server.protocols.langgraph import shapes
from tasks.server.protocols.langgraph.common import (
    ANY,
    agent_named,
    agents,
    body,
    caller_of,
    client_of,
    kind_of_session,
    owner,
    pending_of,
    session_of,
    thread_id_of,
)

router = APIRouter()
MAX_SEARCH = 1000


@router.post("/assistants/search")
async def search_assistants(request: Request) -> list[Document]:
    query = await body(
        request, {"graph_id": ANY, "metadata": ANY, "limit": ANY, "offset": ANY, "name": ANY}
    )
    found = [shapes.assistant(agent) for agent in await agents(request)]
    if query.get("graph_id"):
        found = [a for a in found if a["graph_id"] == query["graph_id"]]
    if query.get("name"):
        found = [a for a in found if a["name"] == query["name"]]
    for key, value in (query.get("metadata") or {}).items():
        found = [a for a in found if a["metadata"].get(key) == value]
    offset, limit = _page(query)
    return found[offset : offset + limit]


@router.get("/assistants/{assistant_id}")
async def get_assistant(request: Request, assistant_id: str) -> Document:
    return shapes.assistant(await agent_named(request, assistant_id))


@router.post("/threads")
async def create_thread(request: Request) -> Document:
    query = await body(request, {"thread_id": ANY, "metadata": ANY, "if_exists": ANY})
    thread_id = thread_id_of(str(query.get("thread_id") or uuid.uuid4()))
    metadata = query.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise HTTPException(422, "field 'metadata' must be an object")
    if_exists = query.get("if_exists") or "raise"
    if if_exists not in ("raise", "do_nothing"):
        raise HTTPException(422, "field 'if_exists' must be 'raise' or 'do_nothing'")
    engine = request.app.state.parent.state.backend.engine
    user = owner(request)

    def create() -> bool:
        with engine.begin() as conn:
            extra = {shapes.THREAD_METADATA: metadata}
            return insert_session(conn, thread_id, user, extra=extra)

    created = await asyncio.to_thread(create)
    if not created and if_exists == "raise":
        # Whoever holds the id (this caller or another): a write must refuse a taken id.
        raise HTTPException(409, f"Thread {thread_id} already exists")
    return await _thread(request, await session_of(request, thread_id))


@router.get("/threads/{thread_id}")
async def get_thread(request: Request, thread_id: str) -> Document:
    return await _thread(request, await session_of(request, thread_id))


@router.delete("/threads/{thread_id}", status_code=204)
async def delete_thread(request: Request, thread_id: str) -> Response:
    session = await session_of(request, thread_id)
    backend = request.app.state.parent.state.backend
    gone_id = str(session["session_id"])

    def delete() -> None:
        gone, _, _ = in_batch(backend.engine, lambda conn: delete_sessions(conn, [gone_id]))
        drop_keys(backend.redis, keys.owned(session_ids=gone))

    await asyncio.to_thread(delete)
    return Response(status_code=204)


@router.post("/threads/search")
async def search_threads(request: Request) -> list[Document]:
    query = await body(
        request,
        {"metadata": ANY, "status": ANY, "ids": ANY, "limit": ANY, "offset": ANY,
         "values": None, "sort_by": ANY, "sort_order": ANY, "select": None},
    )  # fmt: skip
    offset, limit = _page(query)
    user = caller_of(request).user_id
    page = await client_of(request).list_sessions(user_id=user, limit=MAX_SEARCH)
    ids = [str(item["session_id"]) for item in page["items"]]
    if query.get("ids"):
        wanted = {str(i) for i in query["ids"]}
        ids = [i for i in ids if i in wanted]
    found = []
    for thread_id in ids:
        session = await client_of(request).get_session(thread_id, user_id=user)
        if session is None:
            continue
        thread = await _thread(request, session)
        if query.get("status") and thread["status"] != query["status"]:
            continue
        metadata = query.get("metadata") or {}
        if any(thread["metadata"].get(k) != v for k, v in metadata.items()):
            continue
        found.append(thread)
    return found[offset : offset + limit]


@router.get("/threads/{thread_id}/state")
async def get_state(request: Request, thread_id: str) -> Document:
    session = await session_of(request, thread_id)
    kind = await kind_of_session(request, session)
    return shapes.state(session, await pending_of(request, session), kind)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def get_state_at(request: Request, thread_id: str, checkpoint_id: str) -> Document:
    revision = _revision(checkpoint_id)
    await session_of(request, thread_id)
    past = await client_of(request).get_session(
        thread_id, user_id=caller_of(request).user_id, revision=revision
    )
    if past is None:
        raise HTTPException(404, "Checkpoint not found")
    return shapes.state(past, [], "phases")


@router.post("/threads/{thread_id}/state")
async def update_state(request: Request, thread_id: str) -> Document:
    """``values.messages`` appended to the thread's history as one new checkpoint (a
    revision), on a thread of a phases agent. A checkpoint to branch from, or
    ``as_node``, is refused: no node is replayed here."""
    query = await body(request, {"values": ANY, "as_node": None, "checkpoint": None,
                                 "checkpoint_id": None})  # fmt: skip
    session = await session_of(request, thread_id)
    if await kind_of_session(request, session) == "langgraph":
        # Its graph's state is its own checkpoints, which appending to the history would
        # leave behind: refused rather than diverge.
        raise HTTPException(422, "update_state on a LangGraph graph's thread is not supported")
    values = query.get("values")
    if not isinstance(values, dict) or set(values) != {"messages"}:
        raise HTTPException(422, "field 'values' must be {\"messages\": [...]}")
    raw = values["messages"]
    items = [raw] if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items:
        raise HTTPException(422, "field 'values.messages' must be a message or a list of them")
    messages = [_history_item(item) for item in items]
    revision = await client_of(request).append_messages(
        str(session["session_id"]), messages, user_id=caller_of(request).user_id
    )
    checkpoint = {"thread_id": str(session["session_id"]), "checkpoint_ns": "",
                  "checkpoint_id": str(revision), "checkpoint_map": {}}  # fmt: skip
    return {"checkpoint": checkpoint, "configurable": checkpoint}


def _history_item(item: Any) -> Document:
    """A LangGraph message (``{"type": "human"|"ai"}`` or ``{"role": "user"|"assistant"}``)
    as a history item; its id is kept."""
    kind = item.get("type") or item.get("role") if isinstance(item, dict) else None
    role = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant"}
    if kind not in role:
        raise HTTPException(422, "field 'values.messages': each needs type 'human' or 'ai'")
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    # Not ``message_id``: that names a run (a turn's message), and this one is none.
    metadata = {"lg_id": str(item["id"])} if item.get("id") else {}
    return {"role": role[kind], "content": content, "metadata": metadata}


@router.post("/threads/{thread_id}/history")
async def get_history(request: Request, thread_id: str) -> list[Document]:
    query = await body(request, {"limit": ANY, "before": ANY, "metadata": None, "checkpoint": None})
    session = await session_of(request, thread_id)
    limit = _page(query, default=10)[1]
    before = query.get("before")
    top = int(session.get("revision") or 0)
    if isinstance(before, dict) and "checkpoint_id" in (before.get("configurable") or before):
        top = _revision(str((before.get("configurable") or before)["checkpoint_id"])) - 1
    client, user = client_of(request), caller_of(request).user_id
    states: list[Document] = []
    for past in reversed(await client.revisions(thread_id, user_id=user)):
        revision = int(past["revision"])
        if revision > top or past.get("phase") not in ("idle", "clarifying", "awaiting_approval"):
            continue
        at = await client.get_session(thread_id, user_id=user, revision=revision)
        if at is not None:
            states.append(shapes.state(at, [], "phases"))
        if len(states) >= limit:
            break
    return states


async def _thread(request: Request, session: Document) -> Document:
    kind = await kind_of_session(request, session)
    return shapes.thread(session, await pending_of(request, session), kind)


def _page(query: Document, default: int = 10) -> tuple[int, int]:
    limit, offset = query.get("limit", default), query.get("offset", 0)
    if not _whole(limit) or not 1 <= limit <= MAX_SEARCH:
        raise HTTPException(422, f"field 'limit' must be 1-{MAX_SEARCH}")
    if not _whole(offset) or offset < 0:
        raise HTTPException(422, "field 'offset' must be 0 or more")
    return int(offset), int(limit)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _revision(checkpoint_id: str) -> int:
    if not checkpoint_id.isdigit() or len(checkpoint_id) > 18:
        raise HTTPException(404, "Checkpoint not found")
    return int(checkpoint_id)
