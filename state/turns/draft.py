"""The values one phase delivery passes around: the delivery itself, the draft change the
handler's result becomes, the follow-ups to send after the commit, and the outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import InvalidPayloadError
from state.events.log import REPLY, TURN_CANCELLED, TURN_FAILED, reply_event
from state.machine import AgentStateMachine, Phase
from state.session import SessionStatus, make_message
from state.sessions.snapshot import InboxState, NewEvent, SessionChange, Snapshot, Staged


@dataclass(frozen=True)
class Delivery:
    """One phase task's message as the engine handles it.

    ``revision`` is the session revision the message expects (None: a kick that starts
    a turn if the session rests). A retried or redelivered task sets ``use_cache`` to
    False: its own commit may have landed unseen, and only the database can tell.
    ``redelivered``: the broker delivers it again because its worker was lost, so it
    counts as a recovery of that revision (AGENTSTATE_MAX_RECOVERIES). ``carried``: the
    snapshot at ``revision`` the message carries (``Snapshot.to_cache`` as JSON):
    untrusted, so its commit lands only if the row holds exactly it.
    """

    phase: Phase
    session_id: str
    revision: int | None
    task_id: str | None = None
    use_cache: bool = True
    redelivered: bool = False
    carried: str | None = None


@dataclass
class PhaseOutcome:
    """What one phase task did (it is the task's result, so Flower shows it)."""

    session_id: str
    status: str
    phases: list[str] = field(default_factory=list)
    revision: int | None = None
    # How the turn ended in what this task committed: "replied", "failed" (an apology,
    # with ``error`` its cause) or "cancelled"; None while it goes on.
    turn: str | None = None
    error: str | None = None

    def note_turn(self, events: list[NewEvent]) -> None:
        """Record how the turn ended, if the committed ``events`` end it."""
        for event in events:
            if event.kind == TURN_FAILED:
                self.turn, self.error = "failed", str(event.data.get("detail") or "")
                return
            if event.kind == TURN_CANCELLED:
                self.turn = "cancelled"
                return
            if event.kind == REPLY:
                self.turn = "replied"

    def as_dict(self) -> Document:
        """JSON-ready form (by hand: ``dataclasses.asdict`` deep-copies, five times the
        cost, on every phase)."""
        return {
            "session_id": self.session_id,
            "status": self.status,
            "phases": list(self.phases),
            "revision": self.revision,
            "turn": self.turn,
            "error": self.error,
        }


def _nothing() -> None:
    pass


class Draft:
    """The change one phase makes, assembled before its guarded commit."""

    def __init__(self, snap: Snapshot, task_id: str | None) -> None:
        self.snap = snap
        self.machine = AgentStateMachine(snap.session_id, snap.phase)
        self.doc = dict(snap.doc)
        self.context: Document = dict(self.doc.get("context_window") or {})
        self.metadata: Document = dict(self.doc.get("metadata") or {})
        self.messages: list[Document] = []
        self.inbox: dict[str, InboxState] = {}
        self.ops: list[Callable[[Any], None]] = []
        self.prepare: list[Callable[[Any], None]] = []
        # The events this commit appends, the triggers it fired (its record's trigger,
        # or ``label`` when it fired none), and how many events the handler emitted.
        self.events: list[NewEvent] = []
        self.fired: list[str] = []
        self.label: str | None = None
        self.emitted = 0
        self.deadline = snap.deadline_at
        self.task_id = task_id
        self.turn_over = False
        # The message this phase streamed chunks of (ctx.stream), whose stored chunks go
        # once its reply is committed.
        self.streamed: str | None = None
        self.roots: list[tuple[str, str, int]] = []
        self.user_writes: list[tuple[str, int, Document]] = []
        # Called before the handler reads the database (its history, the user's state):
        # the engine writes the commits it holds back, which the read must see.
        self.before_read: Callable[[], None] = _nothing
        # The commits held back before this phase (its snapshot is the last one's result):
        # whoever commits from this draft's checkpoint sends them first.
        self.held_back: list[Staged] = []
        self._base: tuple[Any, ...] | None = None

    def checkpoint(self) -> None:
        """Remember the draft as it is, before the handler's changes."""
        self._base = (
            self.machine.state,
            dict(self.doc),
            dict(self.context),
            dict(self.metadata),
            list(self.messages),
            dict(self.inbox),
            list(self.events),
            list(self.fired),
            self.label,
        )

    def at_checkpoint(self) -> Draft:
        """A new draft holding what this one held at its checkpoint (so that another
        thread can end the turn while this draft's handler is still running)."""
        twin = Draft(self.snap, None)
        twin._base = self._base
        twin.held_back = self.held_back
        twin.rollback()
        return twin

    def rollback(self) -> None:
        """Forget the handler's changes (they must not leak into an error commit)."""
        if self._base is None:
            self.checkpoint()
        assert self._base is not None
        state, doc, context, metadata, messages, inbox, events, fired, label = self._base
        self.machine.state = state
        self.doc, self.context, self.metadata = dict(doc), dict(context), dict(metadata)
        self.messages, self.inbox = list(messages), dict(inbox)
        self.events, self.fired, self.label, self.emitted = list(events), list(fired), label, 0
        self.ops, self.prepare, self.roots, self.user_writes = [], [], [], []
        self.deadline = self.snap.deadline_at

    @property
    def phase(self) -> str:
        """The FSM state after the triggers fired so far."""
        return self.machine.state

    def fire(self, trigger: str) -> None:
        """Fire a trigger; the turn's path records where it went."""
        self.machine.trigger(trigger)
        self.fired.append(str(trigger))
        turn = dict(self.metadata.get("turn") or {})
        turn["path"] = [*turn.get("path", []), self.machine.state]
        self.metadata["turn"] = turn

    def reply(self, text: str, **metadata: Any) -> None:
        """Answer the turn's message and end the turn."""
        message_id = self.context.get("message_id")
        message = make_message("assistant", text, {"reply_to": message_id, **metadata})
        self.messages.append(message)
        self.events.append(reply_event(message))
        if message_id:
            self.inbox[message_id] = InboxState.ANSWERED
        self.turn_over = True

    def emit(self, event: NewEvent, limit: int) -> None:
        """Add an event the handler emitted (at most ``limit`` per phase)."""
        if self.emitted >= limit:
            raise InvalidPayloadError(
                f"a phase may emit at most {limit} events (AGENTSTATE_MAX_EVENTS_PER_PHASE)"
            )
        self.emitted += 1
        self.events.append(event)

    def status(self) -> SessionStatus:
        """SessionStatus for the new phase: paused while waiting for a clarification or
        an approval."""
        if self.phase in (Phase.CLARIFYING, Phase.AWAITING_APPROVAL):
            return SessionStatus.PAUSED
        return SessionStatus.ACTIVE

    def check_storable(self) -> None:
        """Raise InvalidPayloadError now if what the handler produced is not JSON."""
        codec.require_storable([self.doc, self.context, self.metadata, self.messages], "result")

    def change(self) -> SessionChange:
        """The SessionChange to commit."""
        self.doc["context_window"] = self.context
        self.doc["metadata"] = self.metadata
        self.doc["updated_at"] = utcnow().isoformat()
        return SessionChange(
            phase=self.phase,
            status=self.status(),
            doc=self.doc,
            new_messages=self.messages,
            task_id=self.task_id,
            deadline_at=self.deadline,
            inbox_state=self.inbox,
            ops=self.ops,
            check_inbox=self.turn_over,
            # The same list: an op may add an event when it runs (a workflow it cancelled).
            events=self.events,
            trigger="+".join(self.fired) or self.label,
            prepare=self.prepare,
        )
