"""One turn as the event log tells it, for the protocols: its steps (the FSM phases it
walks), its streamed chunks, its reply, an approval it waits on, its failure or cancel.

:func:`watch` follows the session's log from a seq read before the turn was asked for (a
message sent, an approval decided), so nothing of it is missed, and skips what other
turns of the session write meanwhile. It ends with :class:`Ended` once the commit that
ends the turn (or parks it on an approval) is closed by its ``phase_committed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from state.documents.codec import Document
from state.events import log
from state.events.stream import CHUNK_KIND
from state.machine import TRANSITIONS, WORK_PHASES
from state.sessions import turn_records
from state.storage.db import read_connection
from tasks.client.aio import AsyncAgentClient

_WORK = frozenset(str(phase) for phase in WORK_PHASES)


@dataclass(frozen=True)
class StepStarted:
    phase: str


@dataclass(frozen=True)
class StepFinished:
    phase: str


@dataclass(frozen=True)
class Chunk:
    text: str


@dataclass(frozen=True)
class Reply:
    text: str
    kind: str | None


@dataclass(frozen=True)
class ApprovalAsked:
    approval_id: str
    action: str
    args: Document
    expires_at: str | None


@dataclass(frozen=True)
class Failed:
    cause: str
    detail: str


@dataclass(frozen=True)
class Cancelled:
    rolled_back: bool


@dataclass(frozen=True)
class Emitted:
    """An event a handler emitted with ``ctx.emit`` during the turn."""

    kind: str
    data: Document


@dataclass(frozen=True)
class Ended:
    """The turn's last commit is in: it answered, was cancelled, or waits on an approval."""


TurnItem = (
    StepStarted
    | StepFinished
    | Chunk
    | Reply
    | ApprovalAsked
    | Failed
    | Cancelled
    | Emitted
    | Ended
)


def _read_head(engine: Engine, session_id: str) -> tuple[int, str] | None:
    with read_connection(engine) as conn:
        return turn_records.head(conn, session_id)


async def head(engine: Engine, session_id: str) -> tuple[int, str] | None:
    """The seq of the session's last event and its owner (None: no such session)."""
    return await asyncio.to_thread(_read_head, engine, session_id)


def _read_message_state(engine: Engine, session_id: str, message_id: str) -> str | None:
    with read_connection(engine) as conn:
        return turn_records.message_state(conn, session_id, message_id)


async def message_state(engine: Engine, session_id: str, message_id: str) -> str | None:
    """``queued``, ``started``, ``answered`` or ``rolled_back`` (None: not the session's)."""
    return await asyncio.to_thread(_read_message_state, engine, session_id, message_id)


def _read_keys(engine: Engine, session_id: str, message_ids: list[str]) -> dict[str, str]:
    with read_connection(engine) as conn:
        return turn_records.idempotency_keys(conn, session_id, message_ids)


async def idempotency_keys(
    engine: Engine, session_id: str, message_ids: list[str]
) -> dict[str, str]:
    """message id -> the idempotency key it was sent with, for those sent with one."""
    return await asyncio.to_thread(_read_keys, engine, session_id, message_ids)


def walk(source: str, trigger: str | None, dest: str) -> list[str]:
    """The phases a commit entered, in order: ``receive_input+intent_clear`` from ``idle``
    enters ``understanding`` then ``planning``. A trigger the table does not know (or
    none: a cancel) entered ``dest`` alone."""
    entered: list[str] = []
    current = source
    for name in (trigger or "").split("+"):
        found = _next(current, name)
        if found is None:
            return [dest] if dest != source else []
        entered.append(found)
        current = found
    return entered if current == dest else [dest]


def _next(current: str, trigger: str) -> str | None:
    for row in TRANSITIONS:
        sources: Any = row["source"]
        if row["trigger"] == trigger and (sources == "*" or current in sources):
            return str(row["dest"])
    return None


class _Turn:
    """What one turn has shown so far (see :func:`watch`)."""

    def __init__(self, message_id: str, started: bool) -> None:
        self.message_id = message_id
        self.ours = started
        self.step: str | None = None
        self.end_revision: int | None = None

    def take(self, event: Document) -> list[TurnItem]:
        kind, data = event["kind"], event.get("data") or {}
        if kind == CHUNK_KIND:
            mine = self.ours and self.end_revision is None
            return [Chunk(str(data.get("text", "")))] if mine and self._mine(data) else []
        if not self.ours:
            self.ours = kind == log.TURN_STARTED and self._mine(data)
            return []
        if kind == log.PHASE_COMMITTED:
            return self._phases(event, data)
        if self.end_revision is not None:
            return []  # the turn has answered: later events of its commit add nothing
        return self._outcome(event, kind, data)

    def _mine(self, data: Document) -> bool:
        return data.get("message_id") == self.message_id

    def _outcome(self, event: Document, kind: str, data: Document) -> list[TurnItem]:
        if kind == log.REPLY and self._mine(data):
            self.end_revision = int(event["revision"])
            return [Reply(str(data.get("text", "")), data.get("kind"))]
        if kind == log.APPROVAL_REQUESTED and not data.get("workflow_id"):
            self.end_revision = int(event["revision"])
            return [
                ApprovalAsked(
                    str(data["approval_id"]),
                    str(data.get("action", "")),
                    dict(data.get("args") or {}),
                    data.get("expires_at"),
                )
            ]
        if kind == log.TURN_FAILED:
            return [Failed(str(data.get("cause", "error")), str(data.get("detail", "")))]
        if kind == log.TURN_CANCELLED and self._mine(data):
            rolled_back = bool(data.get("rolled_back"))
            if rolled_back:  # no reply follows: the turn left the history
                self.end_revision = int(event["revision"])
            return [Cancelled(rolled_back)]
        if kind not in log.BUILT_IN:
            return [Emitted(kind, dict(data))]
        return []

    def _phases(self, event: Document, data: Document) -> list[TurnItem]:
        items: list[TurnItem] = []
        for phase in walk(str(data.get("from")), data.get("trigger"), str(event["phase"])):
            if self.step is not None:
                items.append(StepFinished(self.step))
                self.step = None
            if phase in _WORK and self.end_revision is None:
                items.append(StepStarted(phase))
                self.step = phase
        if self.end_revision is not None and int(event["revision"]) >= self.end_revision:
            if self.step is not None:
                items.append(StepFinished(self.step))
                self.step = None
            items.append(Ended())
        return items


async def watch(
    client: AsyncAgentClient,
    session_id: str,
    message_id: str,
    after: int,
    user_id: str | None,
    *,
    started: bool = False,
    timeout: float | None = None,
) -> AsyncIterator[TurnItem]:
    """The turn of ``message_id``, from the session's events after ``after`` (``started``:
    the turn is already running, as when its approval was just decided); without
    :class:`Ended` when ``timeout`` seconds pass first."""
    turn = _Turn(message_id, started)
    source = client.events(
        session_id, after=after, follow=True, user_id=user_id, tokens=True, timeout=timeout
    )
    try:
        async for event in source:
            for item in turn.take(event):
                yield item
                if isinstance(item, Ended):
                    return
    finally:
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()


async def already_ended() -> AsyncIterator[TurnItem]:
    """The items of a turn that ended before it was watched: its end alone."""
    yield Ended()
