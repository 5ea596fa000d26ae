"""``POST /agui/{agent}``: a ``RunAgentInput`` in, the run's AG-UI events out (SSE).

threadId = session; a run = a turn. The new turn's message is the last user message in
``messages`` (sent with the message's id as its idempotency key, so a retried request
starts no second turn). A run that ends on an approval finishes with the outcome
``interrupt``; the next ``RunAgentInput`` whose ``resume`` answers it decides the
approval and streams the rest of that turn (it starts no new one). Everything that can
be refused is refused before the stream begins, with the service's usual error answer;
once begun, a failure is a ``RUN_ERROR``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import RunAgentInput, RunErrorEvent
from fastapi import APIRouter, Request
from pydantic import ValidationError

from config.agents import DEFAULT_AGENT
from state.agent_set import AGENT_KEY
from state.documents import codec
from state.documents.codec import Document
from state.errors import BadInputError, InvalidPayloadError, NotFoundError, SessionOwnershipError
from state.ids import validate_id
from state.sessions.snapshot import InboxState
from tasks.client.aio import AsyncAgentClient
from tasks.server.auth import Caller
from tasks.server.context import Client, Config, Who, unknown_session
from tasks.server.protocols import turns
from tasks.server.protocols.agents import acting_user, require_agent
from tasks.server.protocols.agui import projection
from tasks.server.sse import EventStream, StreamLimits, StreamSlots

router = APIRouter(prefix="/agui", tags=["ag-ui"])

# The newest history items a MESSAGES_SNAPSHOT carries (a run's cost stays flat however
# long the conversation; older messages stay in the client's own list).
SNAPSHOT_MESSAGES = 1000
_KEY_CHARS = 200


def _encode(event: Document) -> bytes:
    """AG-UI's SSE framing: one ``data:`` line per event, no ``id:``."""
    return f"data: {codec.dumps(event)}\n\n".encode()


@router.post("/{agent}", include_in_schema=False)
async def run_agent(
    agent: str, request: Request, who: Who, client: Client, settings: Config
) -> EventStream:
    require_agent(settings, agent)
    run = _parsed(await request.body())
    session_id = validate_id(run.thread_id, "thread (session)")
    found = await turns.head(request.app.state.backend.engine, session_id)
    owner = found[1] if found is not None else None
    if owner is not None and who.user_id is not None and owner != who.user_id:
        raise unknown_session(session_id)
    forwarded = run.forwarded_props if isinstance(run.forwarded_props, dict) else {}
    user = acting_user(who, owner, forwarded.get("user_id"))
    after = found[0] if found is not None else 0
    state: str | None = InboxState.STARTED
    slots: StreamSlots = request.app.state.streams
    release = slots.take()  # before anything is sent: a full house changes nothing
    try:
        if run.resume:
            if found is None:
                raise unknown_session(session_id)
            message_id = await _resume(client, who, user, session_id, run, agent=agent)
            started = True
        else:
            message_id, state = await _send(request, client, user, session_id, run, agent=agent)
            started = state != InboxState.QUEUED
    except BaseException:
        release()
        raise
    if not started or state == InboxState.STARTED:
        items = turns.watch(client, session_id, message_id, after, who.user_id, started=started)
    else:  # a retried request whose turn is over: the snapshots tell its outcome
        items = turns.already_ended()

    engine = request.app.state.backend.engine

    async def session() -> tuple[Document, dict[str, str]] | None:
        doc = await client.get_session(
            session_id, user_id=who.user_id, history_limit=SNAPSHOT_MESSAGES
        )
        if doc is None:
            return None
        keys = await turns.idempotency_keys(engine, session_id, projection.user_message_ids(doc))
        return doc, projection.client_ids(keys)

    return EventStream(
        _dumped(projection.run_events(run, message_id, items, session)),
        StreamLimits(heartbeat=settings.stream_heartbeat, lifetime=settings.stream_max_seconds),
        request.app.state.draining,
        release,
        encoder=_encode,
    )


def _parsed(body: bytes) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate_json(body or b"null")
    except ValidationError as exc:
        first: Any = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InvalidPayloadError(
            f"not an AG-UI RunAgentInput: {where}: {first.get('msg', 'invalid')}"
        ) from None


async def _send(
    request: Request,
    client: AsyncAgentClient,
    user: str,
    session_id: str,
    run: RunAgentInput,
    *,
    agent: str,
) -> tuple[str, str | None]:
    """Send the run's new message; its id, and where it is (an ``InboxState``: a retried
    request names a message that may be running or answered already)."""
    own_id, text = projection.last_user_text(run)
    key = f"{projection.KEY_PREFIX}{own_id}"
    if len(key) > _KEY_CHARS:  # kept whole, it would not fit the column: no id kept then
        key = "agui#" + hashlib.sha256(own_id.encode()).hexdigest()
    try:
        message_id = await client.send_message(
            session_id, text, user_id=user, idempotency_key=key, agent=agent
        )
    except SessionOwnershipError:
        raise unknown_session(session_id) from None
    state = await turns.message_state(request.app.state.backend.engine, session_id, message_id)
    return message_id, state


async def _resume(
    client: AsyncAgentClient,
    who: Caller,
    user: str,
    session_id: str,
    run: RunAgentInput,
    *,
    agent: str,
) -> str:
    """Decide the approval the run's ``resume`` answers; the id of the turn it parked."""
    entries = run.resume or []
    if len(entries) != 1:
        raise InvalidPayloadError(
            f"resume must answer exactly one interrupt (the pending approval); got {len(entries)}"
        )
    entry = entries[0]
    approve, note = _decision(entry.status, entry.payload)
    pending = await client.approvals(user_id=who.user_id, pending=True)
    if not any(
        item["approval_id"] == entry.interrupt_id and item.get("session_id") == session_id
        for item in pending
    ):
        raise NotFoundError(f"no pending interrupt {entry.interrupt_id!r} on this thread")
    doc = await client.get_session(session_id, user_id=who.user_id, history_limit=0) or {}
    if doc.get(AGENT_KEY, DEFAULT_AGENT) != agent:
        raise BadInputError(
            f"thread {session_id} runs agent {doc.get(AGENT_KEY)!r}, not {agent!r}; "
            "nothing was decided"
        )
    turn = (doc.get("metadata") or {}).get("turn") or {}
    message_id = turn.get("message_id")
    if not isinstance(message_id, str):
        raise NotFoundError(f"no pending interrupt {entry.interrupt_id!r} on this thread")
    await client.decide(entry.interrupt_id, approve, user, note=note, user_id=who.user_id)
    return message_id


def _decision(status: str, payload: object) -> tuple[bool, str | None]:
    if status == "cancelled":
        return False, None
    approve = payload.get("approve") if isinstance(payload, dict) else None
    note = payload.get("note") if isinstance(payload, dict) else None
    if not isinstance(approve, bool) or not (note is None or isinstance(note, str)):
        raise InvalidPayloadError(
            'a resolved interrupt\'s payload is {"approve": true|false, "note"?: "..."}'
        )
    return approve, note


async def _dumped(events: AsyncIterator[Any]) -> AsyncIterator[Document]:
    """The events as JSON objects (camelCase, absent fields left out); a failure once the
    stream has begun ends it with ``RUN_ERROR``."""
    try:
        async for event in events:
            yield event.model_dump(mode="json", by_alias=True)
    except Exception as exc:
        error = RunErrorEvent(message="the run's stream failed; see the server's log")
        yield error.model_dump(mode="json", by_alias=True)
        raise exc from None
