"""Sessions: send a message, read a session (and its past), follow its events, cancel its
turn, list sessions; and the state machine a turn's path runs through."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request

from state.errors import SessionOwnershipError
from state.machine import STATES, TRANSITIONS
from tasks.server.context import (
    Client,
    Config,
    SessionId,
    Who,
    listing_user,
    unknown_session,
)
from tasks.server.models import (
    ID_PATTERN,
    Cancelled,
    MachineOut,
    MessageAccepted,
    MessageIn,
    RevisionOut,
    SessionOut,
    SessionPage,
    Transition,
)
from tasks.server.sse import MEDIA_TYPE, EventStream, StreamLimits, StreamSlots, last_event_id

router = APIRouter(prefix="/v1", tags=["sessions"])

MAX_HISTORY_PAGE = 1000
DEFAULT_HISTORY_PAGE = 100
MAX_PAGE = 1000
CURSOR_CHARS = 600
MAX_SEQ = 2**63 - 1
# One message of the stream, as an SSE parser hands it over.
SSE_MESSAGE = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "id": {"type": "string", "description": "the event's seq (absent on token chunks)"},
        "event": {"type": "string", "description": "always the default type, message"},
        "data": {"type": "string", "description": "the event as JSON"},
    },
}


@router.post(
    "/sessions/{session_id}/messages",
    status_code=202,
    summary="Send a message",
    description="Stores the message durably (then workers answer it) and returns its id. "
    "The same `Idempotency-Key` with the same text returns the first message id and starts "
    "no second turn; with other text it answers 409. With a user's key, `user_id` must be "
    "that user: any other answers 404, as an unknown session does.",
)
async def send_message(
    *,
    session_id: SessionId,
    body: MessageIn,
    who: Who,
    client: Client,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)
    ] = None,
) -> MessageAccepted:
    if not who.operator and body.user_id != who.user_id:
        raise unknown_session(session_id)
    try:
        message_id = await client.send_message(
            session_id,
            body.text,
            user_id=body.user_id,
            idempotency_key=idempotency_key,
            multitask_strategy=body.multitask_strategy.value,
            agent=body.agent,
        )
    except SessionOwnershipError:
        raise unknown_session(session_id) from None
    return MessageAccepted(message_id=message_id)


@router.get("/sessions", summary="List sessions, newest first")
async def list_sessions(
    *,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    phase: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=CURSOR_CHARS)] = None,
) -> SessionPage:
    user, possible = listing_user(who, user_id)
    if not possible:
        return SessionPage(items=[], next_cursor=None)
    page = await client.list_sessions(user_id=user, phase=phase, limit=limit, cursor=cursor)
    return SessionPage.model_validate(page)


@router.get(
    "/sessions/{session_id}",
    summary="Read a session",
    description="The session with the newest `history_limit` history items before "
    "`before_seq` (oldest first; each has its `seq`); with `revision`, the session as it "
    "was when that revision was committed.",
)
async def get_session(
    *,
    session_id: SessionId,
    who: Who,
    client: Client,
    history_limit: Annotated[int, Query(ge=0, le=MAX_HISTORY_PAGE)] = DEFAULT_HISTORY_PAGE,
    before_seq: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    revision: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
) -> SessionOut:
    doc = await client.get_session(
        session_id,
        user_id=who.user_id,
        history_limit=history_limit,
        before_seq=before_seq,
        revision=revision,
    )
    if doc is None:
        raise unknown_session(session_id)
    return SessionOut.model_validate(doc)


@router.get("/sessions/{session_id}/revisions", summary="A session's revisions, oldest first")
async def revisions(
    *,
    session_id: SessionId,
    who: Who,
    client: Client,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
) -> list[RevisionOut]:
    found = await client.revisions(session_id, user_id=who.user_id, after=after, limit=limit)
    return [RevisionOut.model_validate(item) for item in found]


@router.get(
    "/sessions/{session_id}/events",
    summary="Follow a session's events (Server-Sent Events)",
    description="Every event with `seq` above `after` (or above the `Last-Event-ID` header, "
    "which a reconnecting browser sends), then each new one as it commits. Each SSE "
    "message's `id:` is the event's `seq` and its `data:` the event as JSON; `tokens=true` "
    "interleaves token chunks (`seq` null, no `id:`). Comments keep an idle stream open; "
    "the stream ends after `timeout` seconds (at most AGENTSTATE_STREAM_MAX_SECONDS), "
    "and a browser's EventSource then reconnects where it stopped.",
    response_class=EventStream,
    status_code=200,
    responses={200: {"content": {MEDIA_TYPE: {"schema": SSE_MESSAGE}}}},
)
async def events(
    *,
    request: Request,
    session_id: SessionId,
    who: Who,
    client: Client,
    settings: Config,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    tokens: bool = False,
    timeout: Annotated[float | None, Query(gt=0)] = None,
    last_event: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> EventStream:
    resumed = last_event_id(last_event)
    start = resumed if resumed is not None else after
    # Known and the caller's before the answer begins: after that only the stream can end.
    if await client.get_session(session_id, user_id=who.user_id, history_limit=0) is None:
        raise unknown_session(session_id)
    lifetime = min(timeout or settings.stream_max_seconds, settings.stream_max_seconds)
    slots: StreamSlots = request.app.state.streams
    source = client.events(
        session_id, after=start, follow=True, timeout=None, user_id=who.user_id, tokens=tokens
    )
    release = slots.take()  # after anything that may raise: EventStream gives it back
    return EventStream(
        source,
        StreamLimits(heartbeat=settings.stream_heartbeat, lifetime=lifetime),
        request.app.state.draining,
        release,
    )


@router.post(
    "/sessions/{session_id}/cancel",
    summary="Cancel the running turn",
    description="Ends the session's running turn now (one `cancelled` reply); queued "
    "messages still run. `cancelled` is false when no turn was running.",
)
async def cancel_turn(*, session_id: SessionId, who: Who, client: Client) -> Cancelled:
    return Cancelled(cancelled=await client.cancel_turn(session_id, user_id=who.user_id))


@router.get("/fsm", tags=["meta"], summary="The agent state machine (states and transitions)")
async def machine() -> MachineOut:
    rows = []
    for row in TRANSITIONS:
        sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
        rows += [Transition(trigger=row["trigger"], source=s, dest=row["dest"]) for s in sources]
    return MachineOut(states=list(STATES), transitions=rows)
