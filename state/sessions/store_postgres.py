"""The session store on Postgres: a phase commits in one prepared statement.

The guarded session update, the new history rows, the inbox changes, the commit's
events and its revision record travel as one SQL statement (data-modifying CTEs). A
middle phase commits in a single round trip, in autocommit mode. A phase that ends a
turn needs one more statement, in the same transaction: the check for queued messages
must run after the session row is locked and updated, so that a message committed
meanwhile is seen (a statement's own snapshot would miss it). Both go in one query
message (one implicit transaction, one round trip). A commit with extra work
(``ops``, ``prepare``) or a session's first write takes the portable path.

Under the inline policy a quick phase followed by another quick phase in the same worker
is staged (:meth:`PostgresSessionStore.stage`) and travels with the next commit: the
statements of consecutive quick phases go in one query message, one transaction. Each
phase still writes its own revision, record and events; a staged statement that finds
the row moved raises, which undoes the whole message (its writer lost the race).

A snapshot carried in a task message is bound to the row by the same statement: it
updates only a row whose document (in jsonb's canonical text) and columns are the
carried ones, so a forged or stale snapshot commits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.events import log, revisions
from state.sessions.rows import lock_lost, stale
from state.sessions.snapshot import InboxState, SessionChange, Snapshot, Staged
from state.sessions.store import SessionStore, after
from state.storage import prepared
from state.storage.cache import StateCache
from state.storage.db import autocommit_engine

_UPDATE = """
UPDATE sessions SET revision = %(new_revision)s, phase = %(phase)s, status = %(status)s,
    doc = %(doc)s::jsonb, message_count = %(message_count)s, last_task_id = %(task_id)s,
    deadline_at = %(deadline_at)s, recoveries = 0, updated_at = %(now)s,
    event_seq = event_seq + %(event_count)s
WHERE session_id = %(session_id)s AND revision = %(revision)s{bound}
RETURNING session_id, event_seq"""

# IS NOT DISTINCT FROM (the same as = for these never-null columns) is no index
# condition, so the row is found by its key alone: with "user_id = $n" or "phase = $n"
# the generic plan Postgres caches may scan ix_sessions_user_created or
# ix_sessions_phase_created for the session id, reading every session of the user or
# in the phase on each commit.
_BOUND = """
  AND doc::text = (%(seen_doc)s::jsonb)::text
  AND user_id IS NOT DISTINCT FROM %(seen_user_id)s
  AND phase IS NOT DISTINCT FROM %(seen_phase)s AND status = %(seen_status)s
  AND message_count = %(seen_message_count)s
  AND last_task_id IS NOT DISTINCT FROM %(seen_task_id)s
  AND deadline_at IS NOT DISTINCT FROM %(seen_deadline_at)s"""

# The commit's events (numbered from the counter the update bumped, under its row lock)
# and its revision record, in the same statement.
_RECORD = """, e AS (INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
  SELECT s.session_id, s.event_seq - %(event_count)s + v.n, v.item->>'kind',
    %(new_revision)s, %(phase)s, %(now)s, v.item->'data'
  FROM s, jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS v(item, n))
, r AS (INSERT INTO revisions (session_id, revision, phase, status, trigger, at,
    message_count, event_seq, doc, patch)
  SELECT s.session_id, %(new_revision)s, %(phase)s, %(status)s, %(trigger)s, %(now)s,
    %(message_count)s, s.event_seq, %(rev_doc)s::jsonb, %(rev_patch)s::text FROM s)"""

# A turn's last commit reports whether it applied in a transaction-local setting, which
# this statement reads in the same transaction: after the update took the row lock and
# with a snapshot of its own, so it sees a message committed meanwhile. It asks for the
# first queued message in order, as the next turn's read does: the plan that serves that
# order is the partial index of queued messages (an EXISTS was planned on some
# connections over every inbox row of the session).
_DIVISION_BY_ZERO = "22012"

_APPLIED_AND_QUEUED = prepared.prepare(
    "agentstate_applied_and_queued",
    "SELECT current_setting('agentstate.applied', true) = '1', "
    "(SELECT seq FROM inbox WHERE session_id = %(session_id)s AND state = 'queued' "
    "ORDER BY seq LIMIT 1) IS NOT NULL",
)


# A session row as the portable read's ``select(sessions)`` has it (the doc as text).
_READ = prepared.prepare(
    "agentstate_read_session",
    "SELECT session_id, user_id, phase, status, revision, doc::text, message_count, "
    "last_task_id, deadline_at, recoveries FROM sessions WHERE session_id = %(session_id)s",
)


class _SessionColumns(NamedTuple):
    """The columns :data:`_READ` returns, in its order (the driver's rows are tuples)."""

    session_id: str
    user_id: str
    phase: str
    status: str
    revision: int
    doc: str
    message_count: int
    last_task_id: str | None
    deadline_at: float | None
    recoveries: int


class PostgresSessionStore(SessionStore):
    """SessionStore whose commit is one prepared statement (see the module docstring)."""

    def __init__(
        self, engine: Engine, cache: StateCache, statements: prepared.Statements = prepared.PREPARED
    ) -> None:
        super().__init__(engine, cache)
        # A pool of its own: switching a pooled connection in and out of autocommit costs
        # a driver call each way, on the hottest path there is.
        self.autocommit = autocommit_engine(engine)
        self.statements = statements

    @property
    def verifies_carried(self) -> bool:
        """Postgres binds a carried snapshot to the row in the commit (module docstring)."""
        return True

    def _read_only(self, session_id: str) -> Snapshot | None:
        """The row through a prepared statement on the driver cursor (the turn's first
        phase reads it when the cache is behind)."""
        params = {"session_id": session_id}
        row = prepared.first(self.statements.rows(self.autocommit, [(_READ, params)]))
        return self._from_row(None if row is None else _SessionColumns._make(row), None)

    def stage(self, snapshot: Snapshot, change: SessionChange) -> Staged | None:
        """A change the one statement can write, held back (see :meth:`flush`)."""
        if not self._one_statement(snapshot, change) or change.check_inbox:
            return None
        change.doc["phase"] = change.phase
        change.doc["status"] = change.status
        shape = (len(change.new_messages), len(change.inbox_state), snapshot.carried)
        params = parameters(snapshot, change)  # encodes now: a later handler cannot alter it
        return Staged(snapshot, after(snapshot, change), statement(*shape, strict=True), params)

    def flush(self, staged: Sequence[Staged], before_commit: Callable[[], bool] | None) -> None:
        """The held-back statements in one query message: one transaction, so a stale one
        (its division by zero) undoes those before it and stops those after it."""
        if not staged:
            return
        _check_held(staged[0].base, before_commit)
        with _stale_if_unapplied(staged[0].base):
            self.statements.rows(self.autocommit, [(s.statement, s.params) for s in staged])

    def _write_staged(self, conn: Connection, staged: Sequence[Staged]) -> None:
        # In autocommit, one implicit transaction; in the portable path's transaction, a
        # part of it (a commit with ops takes the phases held back before it along).
        if staged:
            with _stale_if_unapplied(staged[0].base):
                self.statements.execute_all(conn, [(s.statement, s.params) for s in staged])

    def _write(
        self,
        snapshot: Snapshot,
        change: SessionChange,
        before_commit: Callable[[], bool] | None,
        staged: Sequence[Staged] = (),
    ) -> bool:
        if not self._one_statement(snapshot, change):
            return super()._write(snapshot, change, before_commit, staged)
        # The lock is checked just before the one statement; the revision guard in that
        # statement still refuses any writer that lost a race.
        _check_held(staged[0].base if staged else snapshot, before_commit)
        params = parameters(snapshot, change)
        shape = (len(change.new_messages), len(change.inbox_state), snapshot.carried)
        statement_ = statement(*shape, reports=change.check_inbox)
        parts = [(s.statement, s.params) for s in staged]
        parts.append((statement_, params))
        if change.check_inbox:
            parts.append((_APPLIED_AND_QUEUED, params))
        first = staged[0].base if staged else snapshot
        with _stale_if_unapplied(first):
            (found,) = self.statements.rows(self.autocommit, parts)
        # After staged statements that all applied (else their error undid everything),
        # the row is ours and at this statement's revision: it applies too.
        applied, queued = bool(found[0]), change.check_inbox and bool(found[-1])
        if not applied:
            raise stale(snapshot)
        return queued

    @staticmethod
    def _one_statement(snapshot: Snapshot, change: SessionChange) -> bool:
        return snapshot.stored and not change.ops and not change.prepare


def _check_held(snapshot: Snapshot, before_commit: Callable[[], bool] | None) -> None:
    if before_commit is not None and not before_commit():
        raise lock_lost(snapshot)


@contextmanager
def _stale_if_unapplied(snapshot: Snapshot) -> Iterator[None]:
    """A held-back statement that found the row moved divides by zero (SQLSTATE 22012):
    that is the writer losing the race for ``snapshot``, nothing else."""
    try:
        yield
    except DBAPIError as exc:
        if getattr(exc.orig, "pgcode", None) == _DIVISION_BY_ZERO:
            raise stale(snapshot) from exc
        raise


@lru_cache(maxsize=128)
def statement(
    messages: int,
    inbox_changes: int,
    bound: bool = False,
    *,
    reports: bool = False,
    strict: bool = False,
) -> prepared.Prepared:
    """The commit statement for a phase adding ``messages`` rows and changing inbox rows
    (``bound``: from a carried snapshot, which the row must hold exactly; ``reports``:
    whether it applied goes to the transaction's ``agentstate.applied`` setting, for
    the statement after it; ``strict``: a staged commit, which fails, division by zero,
    when it does not apply, so that the statements sent with it are undone or stopped).

    Only placeholder numbers are formatted into the SQL; every value is a bound parameter.
    """
    update = _UPDATE.format(bound=_BOUND if bound else "")
    parts = [f"WITH s AS ({update})", _RECORD]
    if messages:
        rows = ", ".join(
            f"(%(seq{i})s::int, %(role{i})s::text, %(content{i})s::text, %(ts{i})s::text, "
            f"%(meta{i})s::jsonb)"
            for i in range(messages)
        )
        parts.append(
            ", m AS (INSERT INTO messages (session_id, seq, role, content, timestamp, metadata) "  # noqa: S608
            f"SELECT s.session_id, v.seq, v.role, v.content, v.ts, v.meta FROM s, "
            f"(VALUES {rows}) AS v(seq, role, content, ts, meta))"
        )
    parts.extend(
        f", i{i} AS (UPDATE inbox SET state = %(inbox_state{i})s "  # noqa: S608
        f"WHERE message_id = %(inbox_id{i})s AND EXISTS (SELECT 1 FROM s))"
        for i in range(inbox_changes)
    )
    if reports:
        parts.append(" SELECT set_config('agentstate.applied', count(*)::text, true) FROM s")
    elif strict:
        parts.append(" SELECT 1 / count(*) FROM s")
    else:
        parts.append(" SELECT count(*) FROM s")
    suffix = "".join(
        name for name, on in (("_bound", bound), ("_reports", reports), ("_strict", strict)) if on
    )
    name = f"agentstate_commit_{messages}_{inbox_changes}{suffix}"
    return prepared.prepare(name, "".join(parts))


def parameters(snapshot: Snapshot, change: SessionChange) -> Document:
    """The bound parameters of :func:`statement` (values only: never spliced into SQL)."""
    doc = codec.dumps(change.doc)
    record = revisions.values_of(snapshot, change, doc)
    items = [*change.events, log.committed(snapshot.phase, change.trigger)]
    params: dict[str, Any] = {
        "session_id": snapshot.session_id,
        "revision": snapshot.revision,
        "new_revision": snapshot.revision + 1,
        "now": utcnow(),
        "phase": change.phase,
        "status": change.status,
        "doc": doc,
        "message_count": record.message_count,
        "task_id": change.task_id,
        "deadline_at": change.deadline_at,
        "event_count": len(items),
        "events": log.as_json(items),
        "trigger": record.trigger,
        "rev_doc": record.doc,
        "rev_patch": record.patch,
    }
    if snapshot.carried:
        params.update(
            seen_doc=codec.dumps(snapshot.doc),
            seen_user_id=snapshot.user_id,
            seen_phase=snapshot.phase,
            seen_status=snapshot.status,
            seen_message_count=snapshot.message_count,
            seen_task_id=snapshot.last_task_id,
            seen_deadline_at=snapshot.deadline_at,
        )
    for i, item in enumerate(change.new_messages):
        params[f"seq{i}"] = snapshot.message_count + i
        params[f"role{i}"] = str(item.get("role", "user"))
        params[f"content{i}"] = str(item.get("content", ""))
        params[f"ts{i}"] = str(item.get("timestamp") or utcnow().isoformat())
        params[f"meta{i}"] = codec.dumps(item.get("metadata") or {})
    for i, (message_id, state) in enumerate(change.inbox_state.items()):
        params[f"inbox_id{i}"] = message_id
        params[f"inbox_state{i}"] = InboxState(state).value
    return params
