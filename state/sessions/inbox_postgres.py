"""The inbox on Postgres: a message to an existing session is accepted in one prepared
statement (one round trip, autocommit), and a turn reads its message with another.

The statement does what the portable accept does in its transaction: it takes the
session row (bumping the inbox and event counters under its lock, so sequence numbers
follow commit order) and inserts the message and its ``message_accepted`` event. A second
statement in the same query message (one transaction, with a snapshot taken after the
row lock) returns the phase the session is in and whether an earlier message of the
session still waits: then that message's kick is on its way, and this one needs none.
It only matches the session's own user, and only while fewer than
AGENTSTATE_MAX_QUEUED_MESSAGES wait in its inbox (counted in the same statement, at most
that many index entries of ix_inbox_session_queued); a new session, another user's
session, a full inbox or an idempotency key take the portable path, which creates the
row, refuses the caller (counting again after the row lock, exactly) or looks the key
up. (The user is compared with IS NOT DISTINCT FROM, no index condition:
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
    AND (SELECT count(*) FROM (SELECT 1 FROM inbox q WHERE q.session_id = %(session_id)s
         AND q.state = 'queued' LIMIT %(max_queued)s) w) < %(max_queued)s
  RETURNING session_id, inbox_seq, phase, revision, event_seq
), i AS (
  INSERT INTO inbox (message_id, session_id, seq, text, state, created_at, idempotency_key)
  SELECT %(message_id)s, s.session_id, s.inbox_seq, %(text)s, 'queued', %(now)s, NULL FROM s
), e AS (
  INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
  SELECT s.session_id, s.event_seq, 'message_accepted', s.revision, s.phase, %(now)s,
    jsonb_build_object('message_id', %(message_id)s::text, 'text', %(text)s::text)
  FROM s
)
SELECT set_config('agentstate.accepted', count(*)::text, true) FROM s""",
)

# After the accept, under its row lock and with a snapshot of its own: the session row as
# the accept left it, and whether an earlier message still waits for its turn (read in the
# accept's own snapshot, a turn that started and ended that message meanwhile would look
# as if it still waited, and this message would wait for the sweep). Nothing if the
# accept matched no row. The quota is counted again here, exactly: the accept's own count
# read its statement's snapshot, from before it waited for the row lock, so racing
# accepts did not see each other. Past the quota the cast fails (there is no RAISE in
# SQL), which undoes the whole message: the accept and its event with it.
_ACCEPTED = prepared.prepare(
    "agentstate_accepted_message",
    """
SELECT s.inbox_seq, s.phase, s.revision, EXISTS (
  SELECT 1 FROM inbox q
  WHERE q.session_id = s.session_id AND q.state = 'queued' AND q.seq < s.inbox_seq),
  CAST(CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM inbox w
    WHERE w.session_id = s.session_id AND w.state = 'queued' LIMIT %(over_quota)s) c)
    >= %(over_quota)s THEN 'AGENTSTATE_MAX_QUEUED_MESSAGES' ELSE '0' END AS integer)
FROM sessions s
WHERE s.session_id = %(session_id)s AND current_setting('agentstate.accepted', true) = '1'""",
)

_NO_QUOTA = 2**62

_NEXT = prepared.prepare(
    "agentstate_next_queued",
    "SELECT message_id, seq, text, created_at FROM inbox "
    "WHERE session_id = %(session_id)s AND state = 'queued' ORDER BY seq LIMIT 1",
)


class PostgresInbox(Inbox):
    """Inbox whose accept (to an existing session, without a key) and whose read of the
    next message are one prepared statement each (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        statements: prepared.Statements = prepared.PREPARED,
        max_queued: int | None = None,
    ) -> None:
        super().__init__(engine, max_queued)
        self.autocommit = autocommit_engine(engine)
        self.statements = statements

    def accept(
        self, session_id: str, user_id: str, text: str, idempotency_key: str | None = None
    ) -> InboxItem:
        """Like :meth:`Inbox.accept`, in one round trip when the session exists."""
        if idempotency_key is not None:
            return super().accept(session_id, user_id, text, idempotency_key)
        message_id, now = new_id("msg"), utcnow()
        # No quota (the engine's own callers): no inbox holds this many.
        limit = self.max_queued or _NO_QUOTA
        params: dict[str, object] = {
            "session_id": session_id,
            "user_id": user_id,
            "message_id": message_id,
            "text": text,
            "now": now,
            "max_queued": limit,
            "over_quota": limit + 1,  # this message is among those counted after it
        }
        parts = [(_ACCEPT, params), (_ACCEPTED, params)]
        try:
            row = prepared.first(self.statements.rows(self.autocommit, parts))
        except DataError as exc:
            if QUEUED_SETTING not in str(exc):
                raise
            row = None  # a racer filled the inbox first: nothing was stored
        if row is None:  # new, not this user's, or full: the portable path decides
            return super().accept(session_id, user_id, text)
        seq, phase, revision, behind, _room = tuple(row)
        needs_kick = owes_kick(phase, behind)
        return InboxItem(
            message_id,
            session_id,
            int(seq),
            text,
            InboxState.QUEUED,
            now,
            needs_kick,
            int(revision),
        )

    def next_queued(self, session_id: str) -> InboxItem | None:
        """The oldest message of the session that has not started its turn."""
        params = {"session_id": session_id}
        row = prepared.first(self.statements.rows(self.autocommit, [(_NEXT, params)]))
        if row is None:
            return None
        message_id, seq, text, created_at = tuple(row)
        return InboxItem(message_id, session_id, seq, text, InboxState.QUEUED, as_utc(created_at))
