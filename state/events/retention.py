"""Retention: beat prunes events and revision records older than
AGENTSTATE_EVENTS_RETAIN_DAYS, in batches (one short transaction each).

A session's current state (its row, its history, its current revision) is never pruned.
A revision older than the cutoff is kept while a newer kept revision is recorded as a
change to it: only revisions below the newest whole-document record older than the
cutoff go, so every kept revision stays readable.

Each run costs what it deletes, not what is kept. Revisions are found through their
whole-document records (checkpoints), not by walking every old row: a checkpoint that has
aged past the cutoff and is not yet a *floor* (``is_floor``: nothing of its session is
left below it) is due, and the partial index ``ix_revisions_unfloored`` holds only those
(migration 0023). A batch takes the oldest due checkpoints, deletes each session's rows
below its newest one and marks that one the floor, which leaves the index. The rows a
floor keeps are never looked at again until a newer checkpoint ages past the cutoff; with
nothing due a run reads one index entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Delete,
    Engine,
    Select,
    bindparam,
    delete,
    select,
    tuple_,
    update,
)

from state.documents.codec import Document
from state.storage.tables import UNFLOORED, events, revisions

BATCH = 1000
MAX_BATCHES = 100


@dataclass
class Pruned:
    """What one pruning run deleted."""

    events: int = 0
    revisions: int = 0

    def as_dict(self) -> Document:
        """JSON-ready form (the task's result)."""
        return asdict(self)


def prune(
    engine: Engine, cutoff: datetime, batch: int = BATCH, max_batches: int = MAX_BATCHES
) -> Pruned:
    """Delete events and revision records older than ``cutoff`` (at most
    ``max_batches`` batches of each per run; the next run goes on)."""
    pruned = Pruned()
    after: datetime | None = None
    for _ in range(max_batches):
        with engine.begin() as conn:
            no_jit(conn)
            deleted, after = events_batch(conn, cutoff, batch, after)
        pruned.events += deleted
        if deleted < batch:
            break
    for _ in range(max_batches):
        with engine.begin() as conn:
            no_jit(conn)
            found, deleted = revisions_batch(conn, cutoff, batch)
        pruned.revisions += deleted
        if found < batch:
            break
    return pruned


def no_jit(conn: Connection) -> None:
    """No JIT compilation for the rest of this transaction: a maintenance batch's
    statements run once each, in milliseconds, and compiling them cost more (tens of
    functions per batch)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL jit = off")


def old_events(cutoff: datetime, batch: int, after: datetime | None = None) -> Select[Any]:
    """Where one batch of events older than ``cutoff`` ends: the ``at`` of its
    ``batch``-th oldest after ``after`` (None: fewer are left). Read from
    ``ix_events_at`` from ``after``, where the batch before ended: the index entries of
    the rows it deleted stay until a vacuum, and a batch that started from the oldest
    entry again would step over all of them."""
    query = select(events.c.at).where(events.c.at < cutoff)
    if after is not None:
        query = query.where(events.c.at > after)
    return query.order_by(events.c.at).offset(batch - 1).limit(1)


def events_through(cutoff: datetime, after: datetime | None, last: datetime | None) -> Delete:
    """The delete of events older than ``cutoff`` after ``after``, up to ``last``
    included (every one of them is due): one range of ``ix_events_at``."""
    statement = delete(events).where(events.c.at < cutoff)
    if after is not None:
        statement = statement.where(events.c.at > after)
    if last is not None:
        statement = statement.where(events.c.at <= last)
    return statement


def events_batch(
    conn: Connection, cutoff: datetime, batch: int, after: datetime | None
) -> tuple[int, datetime | None]:
    """Delete one batch of old events (``batch``, a few more when several share the
    last one's ``at``, or all that are left); (how many, where the next batch starts)."""
    last = conn.execute(old_events(cutoff, batch, after)).scalar()
    deleted = int(conn.execute(events_through(cutoff, after, last)).rowcount)
    return deleted, last


def due_checkpoints(cutoff: datetime, batch: int) -> Select[Any]:
    """The oldest ``batch`` checkpoints older than ``cutoff`` that are no floor yet (read
    from ``ix_revisions_unfloored``: its predicate is spelled here as in the index)."""
    return (
        select(revisions.c.session_id, revisions.c.revision)
        .where(UNFLOORED, revisions.c.at < cutoff)
        .order_by(revisions.c.at)
        .limit(batch)
    )


def revisions_batch(conn: Connection, cutoff: datetime, batch: int) -> tuple[int, int]:
    """Prune below up to ``batch`` due checkpoints; (checkpoints found, rows deleted)."""
    due = conn.execute(due_checkpoints(cutoff, batch)).all()
    floors: dict[str, int] = {}
    for session_id, revision in due:
        floors[session_id] = max(int(revision), floors.get(session_id, 0))
    if not floors:
        return 0, 0
    deleted = _delete_below(conn, floors, cutoff)
    pairs = sorted(floors.items())
    conn.execute(
        update(revisions)
        .where(tuple_(revisions.c.session_id, revisions.c.revision).in_(pairs))
        .values(is_floor=True)
    )
    return len(due), deleted


def _delete_below(conn: Connection, floors: dict[str, int], cutoff: datetime) -> int:
    """Delete each session's records below its floor: one range of the primary key per
    session, nothing else read. (One statement per session, compiled once: a join of the
    floors with the table may be planned as a scan of all of it.)"""
    statement = below_floor_statement(bindparam("session_id"), bindparam("floor"), cutoff)
    return sum(
        int(conn.execute(statement, {"session_id": session_id, "floor": floor}).rowcount)
        for session_id, floor in floors.items()
    )


def below_floor_statement(session_id: Any, floor: Any, cutoff: datetime) -> Delete:
    """The delete of a session's records below ``floor`` (all older than ``cutoff``, as
    every victim is)."""
    return delete(revisions).where(
        revisions.c.session_id == session_id,
        revisions.c.revision < floor,
        revisions.c.at < cutoff,
    )
