"""``/lg`` runs: a run is a turn (its id the turn's message id), started by a message to
the thread's session or resumed by a decision on its pending approval
(``Command(resume=...)``); waited for, streamed and joined from the session's event log."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from state.documents.codec import Document
from state.events import log
from tasks.server.protocols.langgraph import shapes
from tasks.server.protocols.langgraph.common import (
    ANY,
    agent_named,
    body,
    caller_of,
    client_of,
    owner,
    pending_of,
    session_of,
    thread_id_of,
)
from tasks.server.protocols.langgraph.following import Started, follow, result

router = APIRouter()
STRATEGIES = ("reject", "interrupt", "rollback", "enqueue")
RUN_FIELDS: dict[str, Any] = {
    "assistant_id": ANY,
    "input": ANY,
    "command": ANY,
    "multitask_strategy": ANY,
    "if_not_exists": ANY,
    "metadata": {},
    "config": {},
    "context": {},
    "stream_subgraphs": False,
    "stream_resumable": ANY,  # every stream is: its frames carry the event log's ids
    "durability": ANY,  # every step is checkpointed whatever is asked ("sync")
}


async def start(request: Request, thread_id: str, payload: Document) -> Started:
    """Send the run's message (or decide its interrupt); 404 for an unknown thread."""
    thread_id = thread_id_of(thread_id)
    if payload.get("stream_resumable") not in (None, True, False):
        raise HTTPException(422, "field 'stream_resumable' must be a boolean")
    assistant = payload.get("assistant_id")
    if not isinstance(assistant, str):
        raise HTTPException(422, "field 'assistant_id' is required")
    agent = await agent_named(request, assistant)
    client = client_of(request)
    session = await client.get_session(thread_id, user_id=caller_of(request).user_id)
    if session is None and payload.get("if_not_exists") != "create":
        raise HTTPException(404, "Thread not found")
    user = str(session["user_id"]) if session is not None else owner(request)
    aid = shapes.assistant_id(str(agent["name"]))
    command = payload.get("command")
    if command is not None:
        return await _resume(request, session, command, aid)
    text = input_text(payload.get("input"))
    strategy = payload.get("multitask_strategy") or "reject"
    if strategy not in STRATEGIES:
        raise HTTPException(422, f"field 'multitask_strategy' must be one of {STRATEGIES}")
    after = await _last_seq(request, thread_id)
    run_id = await client.send_message(
        thread_id, text, user_id=user, multitask_strategy=strategy, agent=str(agent["name"])
    )
    return Started(thread_id, run_id, aid, user, after=after)


async def _last_seq(request: Request, thread_id: str) -> int:
    """Where the run's events will start: a wait reads the run, not the whole log."""
    engine = request.app.state.parent.state.backend.engine

    def read() -> int:
        with engine.connect() as conn:
            return log.last_seq(conn, thread_id)

    return await asyncio.to_thread(read)


async def _resume(request: Request, session: Document | None, command: Any, aid: str) -> Started:
    if session is None:
        raise HTTPException(404, "Thread not found")
    if not isinstance(command, dict) or set(command) - {"resume"}:
        raise HTTPException(422, "field 'command' supports only 'resume' here")
    pending = await pending_of(request, session)
    if not pending:
        raise HTTPException(409, "Thread has no interrupt to resume")
    approval = pending[0]
    approve, note = _decision(command.get("resume"), str(approval["approval_id"]))
    caller = caller_of(request)
    after = await _last_seq(request, str(session["session_id"]))
    await client_of(request).decide(
        str(approval["approval_id"]), approve, by=caller.user_id or "operator", note=note,
        user_id=caller.user_id,
    )  # fmt: skip
    runs = shapes.run_ids(session)
    run_id = runs[0] if runs else str(approval["approval_id"])
    user = str(session["user_id"])
    thread_id, approval_id = str(session["session_id"]), str(approval["approval_id"])
    return Started(thread_id, run_id, aid, user, approval_id=approval_id, after=after)


def _decision(value: Any, approval_id: str) -> tuple[bool, str | None]:
    """A resume value as a decision: ``{"approved", "note"?}``, agent-chat-ui's
    ``{"decisions": [{"type": "approve"|"reject"}]}``, a bare boolean, or any of these
    under the interrupt's id."""
    if isinstance(value, dict) and set(value) == {approval_id}:
        value = value[approval_id]
    if isinstance(value, bool):
        return value, None
    if isinstance(value, dict) and isinstance(value.get("approved"), bool):
        note = value.get("note")
        return value["approved"], note if isinstance(note, str) else None
    if isinstance(value, dict) and isinstance(value.get("decisions"), list) and value["decisions"]:
        first = value["decisions"][0]
        kind = first.get("type") if isinstance(first, dict) else None
        if kind in ("approve", "reject"):
            message = first.get("message")
            return kind == "approve", message if isinstance(message, str) else None
    raise HTTPException(
        422, "field 'command.resume' must be {\"approved\": bool}, a boolean, or "
        "{\"decisions\": [{\"type\": \"approve\"|\"reject\"}]}"
    )  # fmt: skip


def input_text(value: Any) -> str:
    """The run's message: the last human (``role: user``) message of ``input.messages``."""
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list) or set(value) - {"messages"}:
        raise HTTPException(422, "field 'input' must be {\"messages\": [...]}")
    for item in reversed(messages):
        if isinstance(item, dict) and (item.get("type") == "human" or item.get("role") == "user"):
            return _text(item.get("content"))
    raise HTTPException(422, "field 'input.messages' has no human message")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    raise HTTPException(422, "a message's 'content' must be text or a list of text parts")


def _located(content: Any, run: Started, status: int = 200) -> JSONResponse:
    headers = {"Content-Location": run.location, "Location": run.location}
    return JSONResponse(content, status_code=status, headers=headers)


@router.post("/threads/{thread_id}/runs")
async def create_run(request: Request, thread_id: str) -> JSONResponse:
    # A background run's values are what join answers (its only stream mode here).
    payload = await body(request, {**RUN_FIELDS, "stream_mode": "values"})
    run = await start(request, thread_id, payload)
    return _located(shapes.run(run.thread_id, run.run_id, run.assistant, "pending"), run)


@router.post("/threads/{thread_id}/runs/wait")
async def wait_run(request: Request, thread_id: str) -> JSONResponse:
    run = await start(request, thread_id, await body(request, RUN_FIELDS))
    async for kind, data, _ in follow(request, run):
        if kind == "done":
            return _located(data, run)
    raise AssertionError("follow always ends with done")


@router.get("/threads/{thread_id}/runs")
async def list_runs(request: Request, thread_id: str) -> list[Document]:
    session = await session_of(request, thread_id)
    aid = shapes.assistant_id(str(session.get("agent") or "default"))
    found = []
    for run_id in shapes.run_ids(session):
        status = shapes.run_status(session, run_id) or "pending"
        found.append(shapes.run(str(session["session_id"]), run_id, aid, status, session))
    return found


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get_run(request: Request, thread_id: str, run_id: str) -> Document:
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    aid = shapes.assistant_id(str(session.get("agent") or "default"))
    return shapes.run(str(session["session_id"]), run_id, aid, status, session)


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join_run(request: Request, thread_id: str, run_id: str) -> JSONResponse:
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    run = Started(str(session["session_id"]), run_id, "", str(session["user_id"]))
    if status in ("success", "error", "interrupted"):
        return _located(await result(request, run, status == "error", {}), run)
    run.approval_id = ""  # follow from the start of the log: the run is under way
    async for kind, data, _ in follow(request, run):
        if kind == "done":
            return _located(data, run)
    raise AssertionError("follow always ends with done")


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel_run(request: Request, thread_id: str, run_id: str) -> Response:
    """``action=interrupt`` cancels the run (its message answered ``cancelled``);
    ``rollback`` removes it as the double-texting rollback does (its message leaves the
    history). Both commit before answering, so ``wait`` changes nothing."""
    action = request.query_params.get("action", "interrupt")
    if action not in ("interrupt", "rollback"):
        raise HTTPException(422, "action must be 'interrupt' or 'rollback'")
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    if status in ("running", "interrupted"):
        await client_of(request).cancel_turn(
            str(session["session_id"]),
            user_id=caller_of(request).user_id,
            rollback=action == "rollback",
        )
    return Response(status_code=204)
