"""A session's inbox: user messages stored durably, then taken one turn at a time in
arrival order."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, Select, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from state.clock import as_utc, utcnow
from state.errors import IdempotencyConflictError, QuotaExceededError, SessionOwnershipError
from state.events import log
from state.ids import new_id
from state.machine import RESTING_PHASES
from state.sessions.rows import insert_session
from state.sessions.snapshot import InboxItem, InboxState, NewEvent
from state.storage.db import is_postgres, read_connection
from state.storage.prepared import PREPARED, Statements
from state.storage.tables import inbox, sessions

QUEUED_SETTING = "AGENTSTATE_MAX_QUEUED_MESSAGES"
USER_QUEUED_SETTING = "AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER"


class Inbox:
    """Accepts messages for sessions and hands them to turns in order."""

    def __init__(
        self, engine: Engine, max_queued: int | None = None, max_per_user: int | None = None
    ) -> None:
        self.engine = engine
        # AGENTSTATE_MAX_QUEUED_MESSAGES and AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER (None:
        # no quota, for the engine's own callers).
        self.max_queued = max_queued
        self.max_per_user = max_per_user

    @staticmethod
    def for_engine(
        engine: Engine,
        statements: Statements | None = None,
        max_queued: int | None = None,
        max_per_user: int | None = None,
    ) -> Inbox:
        """The inbox implementation for ``engine``'s database (``statements``: how the
        Postgres one sends its statements, see ``Backend.statements``); ``max_queued``
        messages may wait in one session's inbox."""
        if is_postgres(engine):
            from state.sessions.inbox_postgres import PostgresInbox

            return PostgresInbox(engine, statements or PREPARED, max_queued, max_per_user)
        return Inbox(engine, max_queued, max_per_user)

    def accept(
        self, session_id: str, user_id: str, text: str, idempotency_key: str | None = None
    ) -> InboxItem:
        """Store a user message durably, creating the session for ``user_id`` if new.

        With an ``idempotency_key``, a message already accepted under that key for this
        session is returned instead (``needs_kick`` False: its turn is already owed);
        the same key with other text raises IdempotencyConflictError. The session row
        lock orders racing callers, and a unique index backs it up.
        """
        try:
            with self.engine.begin() as conn:
                return self._accept(conn, session_id, user_id, text, idempotency_key)
        except IntegrityError:
            if idempotency_key is None:
                raise
            with self.engine.begin() as conn:
                found = by_key(conn, session_id, idempotency_key, text)
            if found is None:
                raise
            return found

    def _accept(
        self, conn: Connection, session_id: str, user_id: str, text: str, key: str | None
    ) -> InboxItem:
        insert_session(conn, session_id, user_id)
        # Taking the row lock here orders inbox sequence numbers by commit, so a turn
        # never starts a later message while an earlier one is uncommitted. The message's
        # event is numbered here too, unless a key may make it a repeat (then below).
        numbered = int(key is None)
        owner, seq, phase, revision, event_seq = conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(inbox_seq=sessions.c.inbox_seq + 1, event_seq=sessions.c.event_seq + numbered)
            .returning(
                sessions.c.user_id,
                sessions.c.inbox_seq,
                sessions.c.phase,
                sessions.c.revision,
                sessions.c.event_seq,
            )
        ).one()
        if owner != user_id:
            raise SessionOwnershipError(f"unknown session {session_id!r}")
        found = None if key is None else by_key(conn, session_id, key, text)
        if found is not None:
            return found
        # Counted after the row lock, in a statement of its own (a fresh snapshot):
        # racing accepts of the session count each other, so none slips past.
        self.require_room(conn, session_id)
        self.require_user_room(conn, user_id)
        message_id, now = new_id("msg"), utcnow()
        conn.execute(
            insert(inbox).values(
                message_id=message_id,
                session_id=session_id,
                user_id=user_id,
                seq=seq,
                text=text,
                state=InboxState.QUEUED,
                created_at=now,
                idempotency_key=key,
            )
        )
        accepted = NewEvent(log.MESSAGE_ACCEPTED, {"message_id": message_id, "text": text})
        if numbered:
            at = (int(revision), str(phase))
            log.insert_numbered(conn, session_id, [accepted], last=int(event_seq), at=at)
        else:
            log.append(conn, session_id, [accepted])
        # Read after the row lock: a message that started its turn meanwhile shows so.
        needs_kick = owes_kick(str(phase), has_queued(conn, session_id, before=int(seq)))
        return InboxItem(
            message_id, session_id, int(seq), text, InboxState.QUEUED, now, needs_kick, revision
        )

    def require_room(self, conn: Connection, session_id: str) -> None:
        """QuotaExceededError (naming the setting) if ``max_queued`` messages already wait
        in the session's inbox; counting stops there (ix_inbox_session_queued)."""
        limit = self.max_queued
        if limit is None:
            return
        waiting = select(inbox.c.seq).where(
            inbox.c.session_id == session_id, inbox.c.state == InboxState.QUEUED
        )
        count = conn.execute(
            select(func.count()).select_from(waiting.limit(limit).subquery())
        ).scalar_one()
        if count >= limit:
            raise QuotaExceededError(
                f"session {session_id} has {count} messages waiting: "
                f"{QUEUED_SETTING} is {limit}; wait for its turns (nothing was stored)"
            )

    def require_user_room(self, conn: Connection, user_id: str) -> None:
        """QuotaExceededError (naming the setting) if ``max_per_user`` messages of the user
        already wait, across all their sessions (ix_inbox_user_queued; counting stops
        there). Racing accepts to two sessions of one user may each pass by one."""
        limit = self.max_per_user
        if limit is None:
            return
        waiting = select(inbox.c.seq).where(
            inbox.c.user_id == user_id, inbox.c.state == InboxState.QUEUED
        )
        count = conn.execute(
            select(func.count()).select_from(waiting.limit(limit).subquery())
        ).scalar_one()
        if count >= limit:
            raise QuotaExceededError(
                f"user {user_id} has {count} messages waiting across their sessions: "
                f"{USER_QUEUED_SETTING} is {limit}; wait for their turns (nothing was stored)"
            )

    def accept_in(
        self, conn: Connection, session_id: str, user_id: str, text: str, key: str | None
    ) -> InboxItem:
        """:meth:`accept`'s work inside the caller's transaction (the session exists), for
        a caller that changed the session first in the same transaction."""
        return self._accept(conn, session_id, user_id, text, key)

    def next_queued(self, session_id: str) -> InboxItem | None:
        """The oldest message of the session that has not started its turn."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(inbox)
                .where(inbox.c.session_id == session_id, inbox.c.state == InboxState.QUEUED)
                .order_by(inbox.c.seq)
                .limit(1)
            ).first()
        if row is None:
            return None
        state = InboxState(row.state)
        return InboxItem(
            row.message_id, row.session_id, row.seq, row.text, state, as_utc(row.created_at)
        )

    def resting(self, session_id: str, user_id: str | None = None) -> tuple[str, int] | None:
        """The session's phase and how many messages wait, read together in one statement
        (read apart, a turn starting in between would look like an idle session); None
        if the session is unknown, or is not ``user_id``'s when that is given."""
        query = select(sessions.c.phase, _queued_count(session_id).scalar_subquery()).where(
            sessions.c.session_id == session_id
        )
        if user_id is not None:
            query = query.where(sessions.c.user_id == user_id)
        with read_connection(self.engine) as conn:
            row = conn.execute(query).first()
        return None if row is None else (str(row[0]), int(row[1]))

    def queued_count(self, session_id: str) -> int:
        """How many messages wait for their turn."""
        with read_connection(self.engine) as conn:
            return int(conn.execute(_queued_count(session_id)).scalar_one())


def _queued_count(session_id: str) -> Select[int]:
    return (
        select(func.count())
        .select_from(inbox)
        .where(inbox.c.session_id == session_id, inbox.c.state == InboxState.QUEUED)
    )


def owes_kick(phase: str, behind: bool) -> bool:
    """Whether a message just accepted must kick its session: only a resting session with
    no earlier message waiting (``behind``). Mid-turn, the commit ending the turn takes the
    next message; behind a waiting message, that message's kick starts a turn that goes on
    to this one (and if that kick was lost, the recovery sweep sends it again)."""
    return phase in RESTING_PHASES and not behind


def by_key(conn: Connection, session_id: str, key: str, text: str) -> InboxItem | None:
    """The message accepted earlier under ``key``, if any (same text, or a conflict)."""
    row = conn.execute(
        select(inbox).where(inbox.c.session_id == session_id, inbox.c.idempotency_key == key)
    ).first()
    if row is None:
        return None
    if row.text != text:
        raise IdempotencyConflictError(
            f"idempotency key {key!r} was used for another message on session {session_id}"
        )
    state = InboxState(row.state)
    return InboxItem(
        row.message_id, session_id, row.seq, row.text, state, as_utc(row.created_at), False
    )


def has_queued(conn: Connection, session_id: str, before: int | None = None) -> bool:
    """Whether a message of the session (one whose seq is below ``before``, if given)
    waits in the inbox (inside ``conn``)."""
    where = [inbox.c.session_id == session_id, inbox.c.state == InboxState.QUEUED]
    if before is not None:
        where.append(inbox.c.seq < before)
    row = conn.execute(select(inbox.c.message_id).where(*where).limit(1)).first()
    return row is not None


def mark(conn: Connection, states: dict[str, InboxState]) -> None:
    """Move inbox items to new states (inside ``conn``)."""
    for message_id, state in states.items():
        conn.execute(update(inbox).where(inbox.c.message_id == message_id).values(state=state))
