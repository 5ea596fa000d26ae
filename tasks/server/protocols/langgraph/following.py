"""Following one ``/lg`` run through its thread's event log: what a wait, a join and a
stream read. Each item carries an event id taken from the log (the seq of the event, or
``"<seq>.<n>"`` for the n-th chunk of a reply streamed after event ``seq``), so a stream
broken anywhere resumes from the log with ``Last-Event-ID``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import HTTPException, Request

from state.documents.codec import Document
from state.events import log
from tasks.server.protocols.langgraph import shapes
from tasks.server.protocols.langgraph.common import client_of, pending_of, session_of

RUN_TIMEOUT_S = 600.0  # the longest a wait, a stream or a join follows one run


class Started:
    """A run begun (or resumed) on a thread: whose, and where its events start."""

    def __init__(self, thread_id: str, run_id: str, assistant: str, user: str, **kw: Any):
        self.thread_id, self.run_id, self.assistant, self.user = thread_id, run_id, assistant, user
        self.approval_id: str | None = kw.get("approval_id")  # a resume: the decision's
        self.after: int = kw.get("after", 0)  # the log's last seq before the run began
        self.shown_chunks: int = 0  # a resumed stream: the reply's chunks already shown

    @property
    def location(self) -> str:
        return f"/threads/{self.thread_id}/runs/{self.run_id}"

    def resume_from(self, last_event_id: str) -> None:
        """Follow on after ``Last-Event-ID`` (a seq, or ``<seq>.<n>``); 422 otherwise."""
        seq, _, n = last_event_id.partition(".")
        if not seq.isdigit() or len(seq) > 18 or (n and (not n.isdigit() or len(n) > 9)):
            raise HTTPException(422, "Last-Event-ID must be an id this server sent, or -1")
        self.after, self.shown_chunks = int(seq), int(n or 0)
        self.approval_id = None  # every event after it is this run's to show


async def follow(
    request: Request, run: Started, *, live: bool = True
) -> AsyncIterator[tuple[str, Document, str]]:
    """The run's events as ``(kind, data, event_id)``, ending with ``("done", result,
    id)`` once its turn answered or asked for approval (``result`` the wait body). Not
    ``live``: the events already logged only (a finished run), with no ``done`` if its
    end is not among them."""
    client, mine, cursor = client_of(request), run.approval_id is None, run.after
    async for event in client.events(
        run.thread_id,
        after=run.after,
        follow=live,
        tokens=live,
        timeout=RUN_TIMEOUT_S if live else None,
        user_id=run.user,
    ):
        kind, data = event["kind"], event.get("data") or {}
        if event.get("seq") is not None:
            cursor = int(event["seq"])
        if not mine:  # a new run: from its own message on; a resume: from its decision on
            mine = (kind == log.MESSAGE_ACCEPTED and data.get("message_id") == run.run_id) or (
                kind == log.APPROVAL_DECIDED and data.get("approval_id") == run.approval_id
            )
            continue
        if kind == "token" and data.get("message_id") == run.run_id:
            n = int(data.get("n") or 0)
            if n > run.shown_chunks:
                yield "token", data, f"{cursor}.{n}"
        elif kind == log.REPLY and data.get("message_id") == run.run_id:
            yield (
                "done",
                await result(request, run, data.get("kind") == "apology", data),
                str(cursor),
            )
            return
        elif kind == log.APPROVAL_REQUESTED and data.get("approval_id") != run.approval_id:
            yield "done", await result(request, run, False, data), str(cursor)
            return
        elif kind not in (log.PHASE_COMMITTED, "token"):
            yield kind, data, str(cursor)
    if live:
        timeout = {"__error__": {"error": "TimeoutError", "message": "the run did not end"}}
        yield "done", timeout, str(cursor)


async def result(request: Request, run: Started, failed: bool, data: Document) -> Document:
    """The wait body of a run that ended: the thread's values, its error or interrupt."""
    session = await session_of(request, run.thread_id)
    values = shapes.values(session)
    if failed:
        return {**values, "__error__": {"error": "RunError", "message": data.get("text")}}
    pending = await pending_of(request, session)
    if pending:
        kind = "langgraph" if set(pending[0].get("args") or {}) == {"value"} else "phases"
        values["__interrupt__"] = shapes.interrupts(pending, {"graph": kind})
    return values
