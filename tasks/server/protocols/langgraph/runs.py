"""``/lg`` runs: a run is a turn (its id the turn's message id), started by a message to
the thread's session or resumed by a decision on its pending approval
(``Command(resume=...)``); waited for, streamed and joined from the session's event log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

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

router = APIRouter()
RUN_TIMEOUT_S = 600.0  # the longest a wait, a stream or a join follows one run
STRATEGIES = ("reject", "interrupt", "rollback", "enqueue")
STREAM_MODES = ("values", "updates", "messages-tuple", "messages", "custom", "events")
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
    "stream_resumable": False,
    "durability": ANY,  # every step is checkpointed whatever is asked ("sync")
}


class Started:
    """A run begun (or resumed) on a thread: whose, and where its events start."""

    def __init__(self, thread_id: str, run_id: str, assistant: str, user: str, **kw: Any):
        self.thread_id, self.run_id, self.assistant, self.user = thread_id, run_id, assistant, user
        self.approval_id: str | None = kw.get("approval_id")  # a resume: the decision's
        self.after: int = kw.get("after", 0)  # the log's last seq before the run began

    @property
    def location(self) -> str:
        return f"/threads/{self.thread_id}/runs/{self.run_id}"


async def start(request: Request, thread_id: str, payload: Document) -> Started:
    """Send the run's message (or decide its interrupt); 404 for an unknown thread."""
    thread_id = thread_id_of(thread_id)
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
    text = _input_text(payload.get("input"))
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


def _input_text(value: Any) -> str:
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


async def follow(request: Request, run: Started) -> AsyncIterator[tuple[str, Document]]:
    """The run's events as ``(kind, data)``, ending with ``("done", result)`` once its turn
    answered or asked for approval (``result`` the wait body)."""
    client, mine = client_of(request), run.approval_id is None
    async for event in client.events(
        run.thread_id,
        after=run.after,
        follow=True,
        tokens=True,
        timeout=RUN_TIMEOUT_S,
        user_id=run.user,
    ):
        kind, data = event["kind"], event.get("data") or {}
        if not mine:  # a new run: from its own message on; a resume: from its decision on
            mine = (kind == log.MESSAGE_ACCEPTED and data.get("message_id") == run.run_id) or (
                kind == log.APPROVAL_DECIDED and data.get("approval_id") == run.approval_id
            )
            continue
        if kind == "token" and data.get("message_id") == run.run_id:
            yield "token", data
        elif kind == log.REPLY and data.get("message_id") == run.run_id:
            yield "done", await _result(request, run, data.get("kind") == "apology", data)
            return
        elif kind == log.APPROVAL_REQUESTED and data.get("approval_id") != run.approval_id:
            yield "done", await _result(request, run, False, data)
            return
        elif kind not in (log.PHASE_COMMITTED, "token"):
            yield kind, data
    yield "done", {"__error__": {"error": "TimeoutError", "message": "the run did not end"}}


async def _result(request: Request, run: Started, failed: bool, data: Document) -> Document:
    session = await session_of(request, run.thread_id)
    result = shapes.values(session)
    if failed:
        return {**result, "__error__": {"error": "RunError", "message": data.get("text")}}
    pending = await pending_of(request, session)
    if pending:
        kind = "langgraph" if set(pending[0].get("args") or {}) == {"value"} else "phases"
        result["__interrupt__"] = shapes.interrupts(pending, {"graph": kind})
    return result


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
    async for kind, data in follow(request, run):
        if kind == "done":
            return _located(data, run)
    raise AssertionError("follow always ends with done")


@router.post("/threads/{thread_id}/runs/stream")
async def stream_run(request: Request, thread_id: str) -> StreamingResponse:
    payload = await body(request, {**RUN_FIELDS, "stream_mode": ANY})
    modes = payload.get("stream_mode") or ["values"]
    modes = [modes] if isinstance(modes, str) else modes
    unknown = [m for m in modes if m not in STREAM_MODES]
    if not isinstance(modes, list) or unknown:
        raise HTTPException(422, f"field 'stream_mode': {unknown} not among {STREAM_MODES}")
    run = await start(request, thread_id, payload)
    headers = {"Content-Location": run.location, "Location": run.location}
    frames = _frames(request, run, set(modes))
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


async def _frames(request: Request, run: Started, modes: set[str]) -> AsyncIterator[bytes]:
    yield _sse("metadata", {"run_id": run.run_id, "attempt": 1})
    reply_id = shapes.reply_id(run.run_id)
    async for kind, data in follow(request, run):
        if kind == "token" and modes & {"messages-tuple", "messages"}:
            chunk = {"type": "AIMessageChunk", "content": data.get("text", ""), "id": reply_id}
            yield _sse("messages", [chunk, {"run_id": run.run_id, "thread_id": run.thread_id}])
        elif kind == "done":
            if "__error__" in data:
                yield _sse("error", data["__error__"])
                return
            last = data["messages"][-1:] if data.get("messages") else []
            if "updates" in modes:
                update: Document = {"agent": {"messages": last}}
                if "__interrupt__" in data:
                    update = {"__interrupt__": data["__interrupt__"]}
                yield _sse("updates", update)
            if "values" in modes:
                yield _sse("values", data)
            return
        elif "custom" in modes and kind not in log.BUILT_IN:
            yield _sse("custom", {"kind": kind, "data": data})


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


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
        return _located(await _result(request, run, status == "error", {}), run)
    run.approval_id = ""  # follow from the start of the log: the run is under way
    async for kind, data in follow(request, run):
        if kind == "done":
            return _located(data, run)
    raise AssertionError("follow always ends with done")


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(request: Request, thread_id: str, run_id: str) -> StreamingResponse:
    """Join a run's stream: a finished run's final values, or the rest of a run under way
    (its chunks from the start of its turn). ``Last-Event-ID`` other than ``-1`` (replay
    all) is refused: these frames carry no ids to resume from."""
    query = request.query_params
    # The SDK sends "stream_mode=" when it names none.
    modes = [m for m in query.getlist("stream_mode") if m] or ["values"]
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown:
        raise HTTPException(422, f"stream_mode {unknown} not among {STREAM_MODES}")
    if query.get("cancel_on_disconnect", "false").lower() not in ("false", "0", ""):
        raise HTTPException(422, "cancel_on_disconnect is not supported by this server")
    if request.headers.get("last-event-id", "-1") != "-1":
        raise HTTPException(422, "Last-Event-ID: only -1 (replay all) is supported here")
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    run = Started(str(session["session_id"]), run_id, "", str(session["user_id"]))
    if status in ("success", "error", "interrupted"):
        result = await _result(request, run, status == "error", {})
        frames = _finished_frames(run, result, set(modes))
    else:
        run.approval_id = ""  # follow from the start of the log: the run is under way
        frames = _frames(request, run, set(modes))
    headers = {"Content-Location": run.location}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


async def _finished_frames(run: Started, result: Document, modes: set[str]) -> AsyncIterator[bytes]:
    yield _sse("metadata", {"run_id": run.run_id, "attempt": 1})
    if "__error__" in result:
        yield _sse("error", result["__error__"])
    elif "values" in modes:
        yield _sse("values", result)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel_run(request: Request, thread_id: str, run_id: str) -> Response:
    action = request.query_params.get("action", "interrupt")
    if action != "interrupt":
        raise HTTPException(422, "action 'rollback' is not supported by this server yet")
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    if status in ("running", "interrupted"):
        await client_of(request).cancel_turn(
            str(session["session_id"]), user_id=caller_of(request).user_id
        )
    return Response(status_code=204)
