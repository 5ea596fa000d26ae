"""The inbox on Postgres: a message to an existing session is accepted in one prepared
statement (one round trip, autocommit), and a turn reads its message with another.

The statement does what the portable accept does in its transaction: it takes the
session row (bumping the inbox and event counters under its lock, so sequence numbers
follow commit order) and inserts the message and its ``message_accepted`` event. A second
statement in the same query message (one transaction, with a snapshot taken after the
row lock) returns the phase the session is in and how many of its messages wait (at
most AGENTSTATE_MAX_QUEUED_MESSAGES + 1 entries of ix_inbox_session_queued): if an
earlier one still waits, its kick is on its way and this one needs none; past the quota
the message undoes itself (see ``_ACCEPTED``). It only matches the session's own user; a
new session, another user's session, a full inbox or an idempotency key take the
portable path, which creates the row, refuses the caller (the quota named) or looks the
key up. (The user is compared with IS NOT DISTINCT FROM, no index condition:
the row is found by its key, never by a scan of the user's sessions in
ix_sessions_user_created, which a cached generic plan may choose.)
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.exc import DataError

from state.clock import as_utc, utcnow
from state.ids import new_id
from state.sessions.inbox import QUEUED_SETTING, Inbox, owes_kick
from state.sessions.snapshot import InboxItem, InboxState
from state.storage import prepared
from state.storage.db import autocommit_engine

_ACCEPT = prepared.prepare(
    "agentstate_accept_message",
    """
WITH s AS (
  UPDATE sessions SET inbox_seq = inbox_seq + 1, event_seq = event_seq + 1
  WHERE session_id = %(session_id)s AND user_id IS NOT DISTINCT FROM %(user_id)s
  RETURNING session_id, inbox_seq, phase, revision, event_seq
), i AS (
  INSERT INTO inbox (message_id, session_id, seq, text, state, created_at, idempotency_key,
    user_id)
  SELECT %(message_id)s, s.session_id, s.inbox_seq, %(text)s, 'queued', %(now)s, NULL,
    %(user_id)s FROM s
), e AS (
  INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
  SELECT s.session_id, s.event_seq, 'message_accepted', s.revision, s.phase, %(now)s,
    jsonb_build_object('message_id', %(message_id)s::text, 'text', %(text)s::text)
  FROM s
)
SELECT set_config('agentstate.accepted', count(*)::text, true) FROM s""",
)

# After the accept, under its row lock and with a snapshot of its own: the session row as
# the accept left it, and how many of its messages wait, this one included (read in the
# accept's own snapshot, a turn that started and ended an earlier message meanwhile would
# look as if it still waited, and this message would wait for the sweep; and racing
# accepts, which waited for the row lock, would not count each other). Nothing if the
# accept matched no row. Past AGENTSTATE_MAX_QUEUED_MESSAGES the cast fails (SQL has no
# RAISE), which undoes the whole message: the accept and its event with it.
_ACCEPTED = prepared.prepare(
    "agentstate_accepted_message",
    """
SELECT s.inbox_seq, s.phase, s.revision, w.waiting,
  CAST(CASE WHEN w.waiting >= %(over_quota)s THEN 'AGENTSTATE_MAX_QUEUED_MESSAGES' ELSE '0' END
    AS integer),
  CAST(CASE WHEN u.waiting >= %(over_user_quota)s
    THEN 'AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER' ELSE '0' END AS integer)
FROM sessions s, LATERAL (SELECT count(*) AS waiting FROM (SELECT 1 FROM inbox q
  WHERE q.session_id = s.session_id AND q.state = 'queued' LIMIT %(over_quota)s) c) w,
  LATERAL (SELECT count(*) AS waiting FROM (SELECT 1 FROM inbox q
  WHERE q.user_id = s.user_id AND q.state = 'queued' LIMIT %(over_user_quota)s) c) u
WHERE s.session_id = %(session_id)s AND current_setting('agentstate.accepted', true) = '1'""",
)

_NO_QUOTA = 2**62

_NEXT = prepared.prepare(
    "agentstate_next_queued",
    "SELECT message_id, seq, text, created_at FROM inbox "
    "WHERE session_id = %(session_id)s AND state = 'queued' ORDER BY seq LIMIT 1",
)


class OneTripAccept:
    """One message's accept as the two statements of one query message (``_ACCEPT`` then
    ``_ACCEPTED``), and the item their row describes; the sync and the asyncio clients
    send it each on their own driver."""

    def __init__(
        self,
        session_id: str,
        user_id: str,
        text: str,
        max_queued: int | None,
        max_per_user: int | None = None,
    ) -> None:
        self.session_id, self.text = session_id, text
        self.message_id, self.now = new_id("msg"), utcnow()
        # No quota (the engine's own callers): no inbox holds this many.
        limit = max_queued or _NO_QUOTA
        params: dict[str, object] = {
            "session_id": session_id,
            "user_id": user_id,
            "message_id": self.message_id,
            "text": text,
            "now": self.now,
            "over_quota": limit + 1,  # this message is among those counted after it
            "over_user_quota": (max_per_user or _NO_QUOTA) + 1,
        }
        self.parts: list[prepared.Part] = [(_ACCEPT, params), (_ACCEPTED, params)]

    @staticmethod
    def over_quota(exc: Exception) -> bool:
        """Whether ``exc`` is the quota's own failed cast: nothing was stored."""
        return QUEUED_SETTING in str(exc)

    def item(self, row: prepared.Row) -> InboxItem:
        """The accepted message, from ``_ACCEPTED``'s row."""
        seq, phase, revision, waiting, _room, _user_room = tuple(row)
        # Waiting counts this message too (no later one can have committed: the
        # transaction still held the row lock).
        needs_kick = owes_kick(phase, int(waiting) > 1)
        return InboxItem(
            self.message_id,
            self.session_id,
            int(seq),
            self.text,
            InboxState.QUEUED,
            self.now,
            needs_kick,
            int(revision),
        )


class PostgresInbox(Inbox):
    """Inbox whose accept (to an existing session, without a key) and whose read of the
    next message are one prepared statement each (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        statements: prepared.Statements = prepared.PREPARED,
        max_queued: int | None = None,
        max_per_user: int | None = None,
    ) -> None:
        super().__init__(engine, max_queued, max_per_user)
        self.autocommit = autocommit_engine(engine)
        self.statements = statements

    def accept(
        self, session_id: str, user_id: str, text: str, idempotency_key: str | None = None
    ) -> InboxItem:
        """Like :meth:`Inbox.accept`, in one round trip when the session exists."""
        if idempotency_key is not None:
            return super().accept(session_id, user_id, text, idempotency_key)
        message = OneTripAccept(session_id, user_id, text, self.max_queued, self.max_per_user)
        try:
            row = prepared.first(self.statements.rows(self.autocommit, message.parts))
        except DataError as exc:
            if not message.over_quota(exc):
                raise
            row = None  # a racer filled the inbox first: nothing was stored
        if row is None:  # new, not this user's, or full: the portable path decides
            return super().accept(session_id, user_id, text)
        return message.item(row)

    def next_queued(self, session_id: str) -> InboxItem | None:
        """The oldest message of the session that has not started its turn."""
        params = {"session_id": session_id}
        row = prepared.first(self.statements.rows(self.autocommit, [(_NEXT, params)]))
        if row is None:
            return None
        message_id, seq, text, created_at = tuple(row)
        return InboxItem(message_id, session_id, seq, text, InboxState.QUEUED, as_utc(created_at))
