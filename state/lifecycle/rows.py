"""Deleting a set of sessions or workflows with every row that belongs to them, in the
caller's transaction: what erasure and retention share.

The session rows go first, with their row locks: a turn of one of them that commits
later finds its guarded update matching nothing (StaleStateError) and its whole
transaction (messages, events, user state) rolls back, while whatever a turn committed
before the lock is seen by the deletes that follow (each statement reads anew).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

from sqlalchemy import ColumnElement, Connection, Delete, Engine, Table, delete, select, update
from sqlalchemy.exc import DBAPIError

from state.events.fork import copy_history
from state.storage.tables import Base, quarantine, sessions, steps, workflows

T = TypeVar("T")
# Deadlock detected, serialization failure: the batch is simply run again.
_RETRYABLE = {"40P01", "40001"}
ATTEMPTS = 5


# The pause after each batch, as a multiple of the batch's own time (Settings'
# maintenance_pace): set for a whole erasure or retention run by ``pacing``.
_pace: ContextVar[float] = ContextVar("maintenance_pace", default=0.0)
# However long a batch took, the pause after it is at most this.
MAX_PAUSE_S = 2.0


@contextmanager
def pacing(pace: float) -> Iterator[None]:
    """Within: every :func:`in_batch` pauses ``pace`` times its own time after it."""
    token = _pace.set(pace)
    try:
        yield
    finally:
        _pace.reset(token)


def in_batch(engine: Engine, work: Callable[[Connection], T], quick_commit: bool = False) -> T:
    """Run one batch (:func:`_one_batch`), then pause as :func:`pacing` says: the next
    batch leaves the database (two cores, say) to turns that long."""
    started = time.monotonic()
    result = _one_batch(engine, work, quick_commit)
    pace = _pace.get()
    if pace > 0:
        time.sleep(min(pace * (time.monotonic() - started), MAX_PAUSE_S))
    return result


def _one_batch(engine: Engine, work: Callable[[Connection], T], quick_commit: bool) -> T:
    """Run one batch in a transaction of its own, again if Postgres chose it as a
    deadlock's victim (a batch locks many rows, in another order than a turn or a step
    does). With ``quick_commit`` the commit does not wait for the WAL flush (a delete
    lost in a crash is simply due again). Nothing in it is JIT-compiled."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    # A batch's statements run once each, in milliseconds: compiling
                    # them (JIT) cost more than running them.
                    conn.exec_driver_sql("SET LOCAL jit = off")
                    if quick_commit:
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                return work(conn)
        except DBAPIError as exc:
            code = getattr(exc.orig, "pgcode", None)
            if code not in _RETRYABLE or attempt == ATTEMPTS:
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def delete_sessions(
    conn: Connection,
    session_ids: Sequence[str],
    still_due: ColumnElement[bool] | None = None,
    forks_too: bool = False,
) -> tuple[list[str], Counter[str], list[str]]:
    """Delete these sessions (only those still matching ``still_due``, checked under the
    row lock) and everything of them, their workflows included; with ``forks_too`` the
    forks that read their history go too, else those forks are kept readable
    (:func:`keep_forks_readable`). Returns the sessions deleted, the rows deleted per kind
    and the workflows deleted."""
    counts: Counter[str] = Counter()
    if not session_ids:
        return [], counts, []
    if forks_too:
        forks = select(sessions.c.session_id).where(sessions.c.prefix_session_id.in_(session_ids))
        session_ids = sorted({*session_ids, *(str(r[0]) for r in conn.execute(forks))})
    condition: ColumnElement[bool] = sessions.c.session_id.in_(session_ids)
    if still_due is not None:
        condition = condition & still_due
    gone = [
        str(r[0])
        for r in conn.execute(delete(sessions).where(condition).returning(sessions.c.session_id))
    ]
    counts["sessions"] += len(gone)
    if not gone:
        return gone, counts, []
    keep_forks_readable(conn, gone)
    workflow_ids = [
        str(r[0])
        for r in conn.execute(
            select(workflows.c.workflow_id).where(workflows.c.session_id.in_(gone))
        )
    ]
    counts.update(delete_workflows(conn, workflow_ids))
    for table in keyed_by("session_id"):
        counts[kind_of(table)] += _count(conn, delete(table).where(table.c.session_id.in_(gone)))
    counts["quarantine"] += _count(
        conn,
        delete(quarantine).where(quarantine.c.kind == "session", quarantine.c.key.in_(gone)),
    )
    return gone, counts, workflow_ids


def delete_workflows(conn: Connection, workflow_ids: Sequence[str]) -> Counter[str]:
    """Delete these workflows, their steps and their approvals."""
    counts: Counter[str] = Counter()
    if not workflow_ids:
        return counts
    counts["workflows"] += _count(
        conn, delete(workflows).where(workflows.c.workflow_id.in_(workflow_ids))
    )
    for table in keyed_by("workflow_id"):
        counts[kind_of(table)] += _count(
            conn, delete(table).where(table.c.workflow_id.in_(workflow_ids))
        )
    return counts


def keyed_by(column: str) -> list[Table]:
    """Every table with ``column`` but the sessions and workflows themselves: the rows
    that belong to a session, a workflow or a user (``user_id``). Found by column, so a
    table added later (with its owner's id) is deleted with its owner too."""
    return [
        table
        for table in Base.metadata.sorted_tables
        if column in table.c and table.name not in (sessions.name, workflows.name)
    ]


def kind_of(table: Table) -> str:
    """The name of a table's rows in the counts (``steps`` for ``workflow_steps``)."""
    return "steps" if table is steps else table.name


def _count(conn: Connection, statement: Delete) -> int:
    return int(conn.execute(statement).rowcount)


def keep_forks_readable(conn: Connection, gone: Sequence[str]) -> None:
    """Before the history of the sessions ``gone`` is deleted: each surviving fork that
    reads from one of them gets what it reads. The fork that shares the most becomes
    the holder (the shared rows are copied into it once); the others read from it, so
    no fork reads from a session that reads from another (one level, always)."""
    forks = conn.execute(
        select(sessions.c.session_id, sessions.c.prefix_session_id, sessions.c.prefix_count)
        .where(sessions.c.prefix_session_id.in_(gone), sessions.c.session_id.not_in(gone))
        .order_by(sessions.c.prefix_session_id, sessions.c.prefix_count.desc())
        .with_for_update()
    ).all()
    holders: dict[str, str] = {}
    for fork_id, source_id, count in forks:
        holder, shared = holders.get(source_id), int(count)
        if holder is None:  # the first of each source shares the most: it takes the rows
            holders[source_id] = fork_id
            copy_history(conn, source_id, fork_id, 0, shared)
            shared = 0
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == fork_id)
            .values(prefix_session_id=holder, prefix_count=shared)
        )


def detach_forks(conn: Connection, source_id: str, from_seq: int) -> None:
    """Before ``source_id``'s messages from ``from_seq`` on are deleted (a rolled-back
    turn): the forks that share some of them get their own copy of those."""
    forks = conn.execute(
        select(sessions.c.session_id, sessions.c.prefix_count)
        .where(sessions.c.prefix_session_id == source_id, sessions.c.prefix_count > from_seq)
        .with_for_update()
    ).all()
    for fork_id, count in forks:
        copy_history(conn, source_id, fork_id, from_seq, int(count))
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == fork_id)
            .values(prefix_session_id=source_id if from_seq else None, prefix_count=from_seq)
        )
