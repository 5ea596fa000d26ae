"""``/lg`` run streams (SSE): a run streamed as it starts, and joined later. Every frame
but the first (``metadata``) carries an id from the thread's event log, so every stream is
resumable: a join with ``Last-Event-ID`` goes on after that frame, from the log (a chunk's
id also says how many of its reply's chunks were shown). ``on_disconnect="cancel"``
cancels the run when its streaming client goes away before it ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from state.documents.codec import Document
from state.events import log
from tasks.server.protocols.langgraph import shapes
from tasks.server.protocols.langgraph.common import ANY, body, client_of, session_of
from tasks.server.protocols.langgraph.following import Started, follow, result
from tasks.server.protocols.langgraph.runs import RUN_FIELDS, start

router = APIRouter()
STREAM_MODES = ("values", "updates", "messages-tuple", "messages", "custom", "events")
FINISHED = ("success", "error", "interrupted")
CANCEL_POLLS, CANCEL_POLL_S = 600, 0.2  # how long a run left by its client may wait its turn
_cancelling: set[asyncio.Task[Any]] = set()  # cancels under way (a task needs a holder)


def _modes(value: Any) -> set[str]:
    modes = value or ["values"]
    modes = [modes] if isinstance(modes, str) else modes
    if not isinstance(modes, list) or [m for m in modes if m not in STREAM_MODES]:
        raise HTTPException(422, f"field 'stream_mode' must be among {STREAM_MODES}")
    return set(modes)


@router.post("/threads/{thread_id}/runs/stream")
async def stream_run(request: Request, thread_id: str) -> StreamingResponse:
    payload = await body(request, {**RUN_FIELDS, "stream_mode": ANY, "on_disconnect": ANY})
    modes = _modes(payload.get("stream_mode"))
    on_disconnect = payload.get("on_disconnect") or "continue"
    if on_disconnect not in ("continue", "cancel"):
        raise HTTPException(422, "field 'on_disconnect' must be 'continue' or 'cancel'")
    run = await start(request, thread_id, payload)
    headers = {"Content-Location": run.location, "Location": run.location}
    frames = _frames(request, run, modes, cancel=on_disconnect == "cancel")
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


async def _frames(
    request: Request, run: Started, modes: set[str], *, live: bool = True, cancel: bool = False
) -> AsyncIterator[bytes]:
    yield _sse("metadata", {"run_id": run.run_id, "attempt": 1})
    ended = False
    try:
        async for kind, data, event_id in follow(request, run, live=live):
            ended = kind == "done"
            for frame in _frames_of(run, modes, kind, data):
                yield frame + f"id: {event_id}\n\n".encode()
        ended = True
    finally:
        if cancel and not ended:
            # The client went away (the generator is closed under us): cancel in a task
            # of its own, which this closing generator cannot wait for.
            task = asyncio.get_running_loop().create_task(_cancel(request, run))
            _cancelling.add(task)
            task.add_done_callback(_cancelling.discard)


async def _cancel(request: Request, run: Started) -> None:
    """Cancel the run once its turn runs (it may still wait its turn in the inbox: a
    turn is cancelled, not a message), until it has ended; bounded."""
    client = client_of(request)
    for _ in range(CANCEL_POLLS):
        session = await client.get_session(run.thread_id, user_id=run.user)
        status = None if session is None else shapes.run_status(session, run.run_id)
        if session is None or status in FINISHED:
            return
        if status == "running":
            await client.cancel_turn(run.thread_id, user_id=run.user)
        await asyncio.sleep(CANCEL_POLL_S)


def _frames_of(run: Started, modes: set[str], kind: str, data: Document) -> list[bytes]:
    """The frames (without their ids) one followed event makes in ``modes``."""
    if kind == "token" and modes & {"messages-tuple", "messages"}:
        chunk = {"type": "AIMessageChunk", "content": data.get("text", ""), "id": None}
        chunk["id"] = shapes.reply_id(run.run_id)
        return [_frame("messages", [chunk, {"run_id": run.run_id, "thread_id": run.thread_id}])]
    if kind == "done":
        if "__error__" in data:
            return [_frame("error", data["__error__"])]
        frames = []
        if "updates" in modes:
            last = data["messages"][-1:] if data.get("messages") else []
            update: Document = {"agent": {"messages": last}}
            if "__interrupt__" in data:
                update = {"__interrupt__": data["__interrupt__"]}
            frames.append(_frame("updates", update))
        if "values" in modes:
            frames.append(_frame("values", data))
        return frames
    if "custom" in modes and kind not in log.BUILT_IN and kind != "token":
        return [_frame("custom", {"kind": kind, "data": data})]
    return []


def _frame(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n".encode()


def _sse(event: str, data: Any) -> bytes:
    return _frame(event, data) + b"\n"


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(request: Request, thread_id: str, run_id: str) -> StreamingResponse:
    """Join a run's stream: a finished run's final values, or the rest of a run under way
    (from the start of its turn); with ``Last-Event-ID`` (other than ``-1``, replay all),
    what followed that frame, read from the log."""
    query = request.query_params
    # The SDK sends "stream_mode=" when it names none.
    modes = _modes([m for m in query.getlist("stream_mode") if m])
    if query.get("cancel_on_disconnect", "false").lower() not in ("false", "0", ""):
        raise HTTPException(422, "cancel_on_disconnect is not supported by this server")
    session = await session_of(request, thread_id)
    status = shapes.run_status(session, run_id)
    if status is None:
        raise HTTPException(404, "Run not found")
    run = Started(str(session["session_id"]), run_id, "", str(session["user_id"]))
    last_event_id = request.headers.get("last-event-id", "-1")
    if last_event_id != "-1":
        run.resume_from(last_event_id)
        frames = _frames(request, run, modes, live=status not in FINISHED)
    elif status in FINISHED:
        frames = _finished_frames(run, await result(request, run, status == "error", {}), modes)
    else:
        run.approval_id = ""  # follow from the start of the log: the run is under way
        frames = _frames(request, run, modes)
    headers = {"Content-Location": run.location}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


async def _finished_frames(run: Started, done: Document, modes: set[str]) -> AsyncIterator[bytes]:
    yield _sse("metadata", {"run_id": run.run_id, "attempt": 1})
    if "__error__" in done:
        yield _sse("error", done["__error__"])
    elif "values" in modes:
        yield _sse("values", done)
