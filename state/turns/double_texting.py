"""Double texting: what a message does to a session that is busy answering earlier ones
(``send_message(..., multitask_strategy=...)``).

A session is busy when a turn is running (any phase but ``idle`` and ``clarifying``,
``awaiting_approval`` included) or messages wait in its inbox. Then:

- ``enqueue`` (the default): the message waits its turn, as always. It takes the usual
  accept (on Postgres, one prepared statement); the other strategies take this module's
  transaction, so the usual accept stays exactly as fast.
- ``reject``: SessionBusyError; nothing is stored, no event written.
- ``interrupt``: the running turn is cancelled as by ``cancel_turn`` (one ``cancelled``
  reply), and so is every message still waiting before this one (each joins the history
  with the ``cancelled`` reply: every message the user sent gets exactly one answer);
  then this message runs.
- ``rollback``: the running turn is removed as if its message had never been sent (its
  user message leaves the history, the session's document is as it was when the turn
  started) and the messages waiting before this one are dropped too (marked
  ``rolled_back``, never in the history); then this message runs. What the turn's phases
  committed outside the session (the user's persistent state, a finished workflow's
  effects) stays: other sessions may already have seen it.

Each is one transaction: the session row is locked first, the busy check, the cancel or
rollback and the accept of the new message commit together, so racing senders are
ordered by that lock and each sees what the one before it left. A handler still running
finds the revision moved and its result refused. An idempotency key already used on the
session returns that message and changes nothing (a retried request does not interrupt
twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import Connection, delete, select, update

from state.agent_set import AGENT_KEY
from state.clock import as_utc
from state.documents import codec
from state.documents.codec import Document
from state.errors import InvalidPayloadError, SessionBusyError, SessionOwnershipError
from state.events import log
from state.events.revisions import at_revision
from state.lifecycle.rows import detach_forks
from state.machine import RESTING_PHASES, Phase
from state.migrate import StateMigrator
from state.sessions import inbox as inbox_rows
from state.sessions.rows import insert_session
from state.sessions.snapshot import InboxItem, InboxState, Snapshot, TransactionOp
from state.storage.tables import Base, events, inbox, messages, sessions
from state.storage.tables_checkpoints import CheckpointRow, CheckpointWriteRow
from state.turns import rules
from state.turns.draft import Draft
from state.turns.services import TurnServices

_migrator = StateMigrator()


class MultitaskStrategy(StrEnum):
    """What a message does to a busy session (see the module docstring)."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


def parse_strategy(value: object) -> MultitaskStrategy:
    """``value`` as a strategy, or InvalidPayloadError naming the choices."""
    if isinstance(value, str) and value in set(MultitaskStrategy):
        return MultitaskStrategy(value)
    choices = ", ".join(MultitaskStrategy)
    raise InvalidPayloadError(f"multitask_strategy must be one of {choices}; got {value!r:.40}")


@dataclass
class Accepted:
    """The message accepted, and what its accept ended (for the follow-ups)."""

    item: InboxItem
    ended: Snapshot | None = None  # the session after the turns it ended, if it ended any
    finished: list[str] = field(default_factory=list)  # workflows it cancelled


class DoubleTexting:
    """Accepts a message under a strategy other than ``enqueue`` (module docstring)."""

    def __init__(self, services: TurnServices) -> None:
        self.services = services

    def accept(
        self,
        session_id: str,
        user_id: str,
        text: str,
        idempotency_key: str | None,
        strategy: MultitaskStrategy,
    ) -> InboxItem:
        """Store the message under ``strategy``; the caller kicks and notifies as for any
        accept. Raises SessionBusyError (``reject``), SessionOwnershipError."""
        services = self.services
        holder = services.sync.current_holder(session_id)
        with services.sessions.engine.begin() as conn:
            accepted = self._accept_in(
                conn, session_id, user_id, text, idempotency_key, strategy=strategy
            )
        if accepted.ended is not None:
            # As after a cancel: the worker still holding the lock finds its write refused;
            # its lock is freed now, so the next turn need not wait for it.
            if holder is not None:
                services.sync.release_state_lock(session_id, holder)
            services.sessions.publish(accepted.ended)
            for workflow_id in accepted.finished:
                services.notifier.workflow(workflow_id)
        return accepted.item

    def _accept_in(
        self,
        conn: Connection,
        session_id: str,
        user_id: str,
        text: str,
        key: str | None,
        *,
        strategy: MultitaskStrategy,
    ) -> Accepted:
        inbox_store = self.services.inbox
        if insert_session(conn, session_id, user_id):
            return Accepted(inbox_store.accept_in(conn, session_id, user_id, text, key))
        # The row lock first: racing senders (and the turn's own commits) queue here.
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(inbox_seq=sessions.c.inbox_seq)
        )
        snap = self.services.sessions.load_in(conn, session_id)
        assert snap is not None
        if snap.user_id != user_id:
            raise SessionOwnershipError(f"unknown session {session_id!r}")
        found = None if key is None else inbox_rows.by_key(conn, session_id, key, text)
        if found is not None:
            return Accepted(found)
        running = snap.phase not in RESTING_PHASES
        waiting = _waiting(conn, session_id)
        if not running and not waiting:
            return Accepted(inbox_store.accept_in(conn, session_id, user_id, text, key))
        if strategy == MultitaskStrategy.REJECT:
            what = "a turn is running" if running else f"{len(waiting)} message(s) wait"
            raise SessionBusyError(f"session {session_id} is busy ({what}); nothing was stored")
        ended = self._end(conn, snap, running, waiting, strategy)
        finished = [
            str(event.data["workflow_id"])
            for event in ended[1].events
            if event.kind == log.WORKFLOW_FINISHED
        ]
        item = inbox_store.accept_in(conn, session_id, user_id, text, key)
        return Accepted(item, ended[0], finished)

    def _end(
        self,
        conn: Connection,
        snap: Snapshot,
        running: bool,
        waiting: list[InboxItem],
        strategy: MultitaskStrategy,
    ) -> tuple[Snapshot, Draft]:
        """Cancel or roll back the running turn and the waiting messages, in ``conn``."""
        draft = Draft(snap, None)
        roll_back = strategy == MultitaskStrategy.ROLLBACK
        if running and roll_back:
            before, phase, first_seq = _before_turn(conn, snap)
            message_id = (snap.doc.get("context_window") or {}).get("message_id")
            rules.roll_back_turn(draft, before, phase)
            if AGENT_KEY in snap.doc:  # a session keeps its agent (set by its first message)
                draft.doc[AGENT_KEY] = snap.doc[AGENT_KEY]
            draft.ops.append(_forget_history(snap.session_id, first_seq))
            if message_id:
                draft.ops.append(_forget_checkpoints(snap.session_id, str(message_id)))
        elif running:
            rules.cancel_turn(draft)
        rules.supersede_waiting(draft, waiting, roll_back=roll_back)
        draft.label = str(strategy)
        return self.services.sessions.commit_in(conn, snap, draft.change()), draft


def _waiting(conn: Connection, session_id: str) -> list[InboxItem]:
    """The session's messages waiting for their turn, oldest first."""
    rows = conn.execute(
        select(inbox.c.message_id, inbox.c.seq, inbox.c.text, inbox.c.created_at)
        .where(inbox.c.session_id == session_id, inbox.c.state == InboxState.QUEUED)
        .order_by(inbox.c.seq)
    ).all()
    return [
        InboxItem(
            row.message_id,
            session_id,
            int(row.seq),
            row.text,
            InboxState.QUEUED,
            as_utc(row.created_at),
        )
        for row in rows
    ]


def _before_turn(conn: Connection, snap: Snapshot) -> tuple[Document | None, str, int]:
    """The session's document and phase when its running turn started, and the length of
    its history then (None, ``idle`` and the history's length now, with the turn's own
    user message, when that revision is no longer kept)."""
    message_id = (snap.doc.get("context_window") or {}).get("message_id")
    started = conn.execute(
        select(events.c.revision, events.c.data)
        .where(events.c.session_id == snap.session_id, events.c.kind == log.TURN_STARTED)
        .order_by(events.c.seq.desc())
        .limit(1)
    ).first()
    past = None
    if started is not None and _names(started.data, message_id):
        past = at_revision(conn, snap.session_id, int(started.revision) - 1)
    if past is None or past.phase not in RESTING_PHASES:
        return None, Phase.IDLE, snap.message_count - 1
    doc = _migrator.migrate(past.doc) if _migrator.needs_migration(past.doc) else past.doc
    doc.pop("message_history", None)
    return doc, past.phase, past.message_count


def _names(data: object, message_id: object) -> bool:
    decoded = codec.loads(data) if isinstance(data, str) else data
    return isinstance(decoded, dict) and decoded.get("message_id") == message_id


def _forget_history(session_id: str, first_seq: int) -> TransactionOp:
    def forget(conn: Connection) -> None:
        # A fork made mid-turn shares the rows about to go: it keeps its own copy.
        detach_forks(conn, session_id, first_seq)
        conn.execute(
            delete(messages).where(messages.c.session_id == session_id, messages.c.seq >= first_seq)
        )

    return forget


def _forget_checkpoints(session_id: str, message_id: str) -> TransactionOp:
    """The checkpoints a LangGraph graph wrote during the turn (and their pending writes)
    go too: its next run starts from the checkpoint before the rolled-back turn."""
    tables = Base.metadata.tables
    lg_checkpoints = tables[CheckpointRow.__tablename__]
    lg_writes = tables[CheckpointWriteRow.__tablename__]

    def forget(conn: Connection) -> None:
        written = select(lg_checkpoints.c.checkpoint_id).where(
            lg_checkpoints.c.session_id == session_id, lg_checkpoints.c.message_id == message_id
        )
        conn.execute(
            delete(lg_writes).where(
                lg_writes.c.session_id == session_id, lg_writes.c.checkpoint_id.in_(written)
            )
        )
        conn.execute(
            delete(lg_checkpoints).where(
                lg_checkpoints.c.session_id == session_id,
                lg_checkpoints.c.message_id == message_id,
            )
        )

    return forget
