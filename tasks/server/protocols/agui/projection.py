"""A turn as AG-UI 1.0 events (the ``ag-ui-protocol`` package's own models).

``RUN_STARTED`` first; a ``STEP_STARTED``/``STEP_FINISHED`` pair per FSM phase the turn
walks; the reply as exactly one ``TEXT_MESSAGE_START``/``TEXT_MESSAGE_CONTENT``.../
``TEXT_MESSAGE_END`` (the streamed chunks are its deltas, and what the stored reply has
beyond them one last delta; an unstreamed reply is one delta); what a handler emits as
``CUSTOM``; then ``STATE_SNAPSHOT`` (or ``STATE_DELTA`` against the state the run was sent
with, when smaller: ``delta``) and ``MESSAGES_SNAPSHOT`` of the session as stored, and
``RUN_FINISHED`` (outcome ``success``, ``interrupt`` for an approval, ``cancelled``) or
``RUN_ERROR`` for a turn that failed (after its apology, which is its reply).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    UserMessage,
)

from state.documents.codec import Document
from state.errors import InvalidPayloadError
from tasks.server.protocols import turns
from tasks.server.protocols.agui.delta import cheaper_delta

# What the resume payload of an approval holds (the interrupt's ``responseSchema``).
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["approve"],
    "properties": {"approve": {"type": "boolean"}, "note": {"type": "string"}},
}
_SESSION_FIELDS_LEFT_OUT = ("message_history",)


def reply_id(message_id: str) -> str:
    """The AG-UI id of the reply to ``message_id`` (the same in the text events and in
    every later ``MESSAGES_SNAPSHOT``)."""
    return f"{message_id}.reply"


def last_user_text(run: RunAgentInput) -> tuple[str, str]:
    """The new turn's message: the last user message of ``run`` (its id and its text)."""
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            return message.id, _text_of(message)
    raise InvalidPayloadError("RunAgentInput.messages has no user message to answer")


def _text_of(message: UserMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        text = getattr(part, "text", None)
        if not isinstance(text, str):
            raise InvalidPayloadError(
                f"user message {message.id!r}: only text parts are accepted (got {part.type!r})"
            )
        parts.append(text)
    return "".join(parts)


KEY_PREFIX = "agui:"


def client_ids(keys: dict[str, str]) -> dict[str, str]:
    """message id -> the AG-UI id its sender gave it (kept as its idempotency key)."""
    return {mid: key[len(KEY_PREFIX) :] for mid, key in keys.items() if key.startswith(KEY_PREFIX)}


def user_message_ids(doc: Document) -> list[str]:
    """The message ids of the user messages in ``doc``'s history."""
    found = []
    for item in doc.get("message_history") or []:
        own = (item.get("metadata") or {}).get("message_id")
        if item.get("role") == "user" and isinstance(own, str):
            found.append(own)
    return found


def messages_of(doc: Document, ids: dict[str, str] | None = None) -> list[Message]:
    """The session's history as AG-UI messages. A user message keeps the id its AG-UI
    sender gave it (``ids``), else its message id; a reply is :func:`reply_id`, so a
    snapshot lines up with the messages a client already has."""
    ids = ids or {}
    found: list[Message] = []
    for item in doc.get("message_history") or []:
        metadata = item.get("metadata") or {}
        content = str(item.get("content", ""))
        role = item.get("role")
        if role == "user":
            own = metadata.get("message_id") or f"{doc['session_id']}.{item.get('seq')}"
            found.append(UserMessage(id=ids.get(own, str(own)), content=content))
        elif role == "assistant":
            replied = metadata.get("reply_to")
            own = reply_id(replied) if replied else f"{doc['session_id']}.{item.get('seq')}"
            found.append(AssistantMessage(id=own, content=content))
        elif role == "system":
            own = f"{doc['session_id']}.{item.get('seq')}"
            found.append(SystemMessage(id=own, content=content))
    return found


def state_of(doc: Document) -> Document:
    """The session as ``STATE_SNAPSHOT`` shows it: everything but the history (which
    ``MESSAGES_SNAPSHOT`` carries)."""
    return {key: value for key, value in doc.items() if key not in _SESSION_FIELDS_LEFT_OUT}


class _Reply:
    """The one text message of a reply: started once, its deltas, ended once."""

    def __init__(self, message_id: str) -> None:
        self.id = reply_id(message_id)
        self.sent = ""
        self.open = False
        self.done = False

    def chunk(self, text: str) -> list[BaseEvent]:
        if self.done or not text:
            return []
        self.sent += text
        return [*self._start(), TextMessageContentEvent(message_id=self.id, delta=text)]

    def final(self, text: str) -> list[BaseEvent]:
        if self.done:
            return []
        rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
        events = [*self._start()]
        if rest or not self.sent:
            events.append(TextMessageContentEvent(message_id=self.id, delta=rest or text or " "))
        self.done = True
        return [*events, TextMessageEndEvent(message_id=self.id)]

    def _start(self) -> list[BaseEvent]:
        if self.open:
            return []
        self.open = True
        return [TextMessageStartEvent(message_id=self.id, role="assistant")]


class _Outcome:
    """How the run ends, gathered from the turn's items as they pass."""

    def __init__(self, message_id: str) -> None:
        self.reply = _Reply(message_id)
        self.interrupts: list[Interrupt] = []
        self.failed: turns.Failed | None = None
        self.cancelled = False

    def take(self, item: turns.TurnItem) -> list[BaseEvent]:
        """The AG-UI events ``item`` shows as (none for what only the end tells)."""
        if isinstance(item, turns.StepStarted):
            return [StepStartedEvent(step_name=item.phase)]
        if isinstance(item, turns.StepFinished):
            return [StepFinishedEvent(step_name=item.phase)]
        if isinstance(item, turns.Chunk):
            return self.reply.chunk(item.text)
        if isinstance(item, turns.Reply):
            self.cancelled = self.cancelled or item.kind == "cancelled"
            return self.reply.final(item.text)
        if isinstance(item, turns.Emitted):
            return [CustomEvent(name=item.kind, value=item.data)]
        if isinstance(item, turns.ApprovalAsked):
            self.interrupts.append(_interrupt(item))
        elif isinstance(item, turns.Failed):
            self.failed = item
        elif isinstance(item, turns.Cancelled):
            self.cancelled = True
        return []


async def run_events(
    run: RunAgentInput,
    message_id: str,
    items: AsyncIterator[turns.TurnItem],
    session: Callable[[], Awaitable[tuple[Document, dict[str, str]] | None]],
) -> AsyncIterator[BaseEvent]:
    """The AG-UI events of one run: the turn of ``message_id`` as ``items`` tell it, then
    the session (``session()``: it and its messages' AG-UI ids) as it stands once the
    turn ended or parked."""
    yield RunStartedEvent(
        thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
    )
    outcome = _Outcome(message_id)
    async for item in items:
        for event in outcome.take(item):
            yield event
    reply = outcome.reply
    if reply.open and not reply.done:  # a turn rolled back mid-stream: close what was open
        yield TextMessageEndEvent(message_id=reply.id)
    found = await session()
    if found is not None:
        doc, ids = found
        state = state_of(doc)
        delta = cheaper_delta(run.state, state)
        if delta is None:
            yield StateSnapshotEvent(snapshot=state)
        else:
            yield StateDeltaEvent(delta=delta)
        yield MessagesSnapshotEvent(messages=messages_of(doc, ids))
    yield _last(run, outcome.interrupts, outcome.failed, outcome.cancelled)


def _interrupt(asked: turns.ApprovalAsked) -> Interrupt:
    return Interrupt(
        id=asked.approval_id,
        reason="approval",
        message=f"approve {asked.action}?",
        response_schema=DECISION_SCHEMA,
        expires_at=asked.expires_at,
        metadata={"action": asked.action, "args": asked.args},
    )


def _last(
    run: RunAgentInput,
    interrupts: list[Interrupt],
    failed: turns.Failed | None,
    cancelled: bool,
) -> BaseEvent:
    if failed is not None:
        return RunErrorEvent(message=failed.detail or failed.cause, code=failed.cause)
    outcome: Any = RunFinishedSuccessOutcome()
    if interrupts:
        outcome = RunFinishedInterruptOutcome(interrupts=interrupts)
    elif cancelled:
        outcome = RunFinishedCancelledOutcome()
    return RunFinishedEvent(thread_id=run.thread_id, run_id=run.run_id, outcome=outcome)
