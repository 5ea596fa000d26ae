"""Retention: beat prunes events and revision records older than
AGENTSTATE_EVENTS_RETAIN_DAYS, in batches (one short transaction each).

A session's current state (its row, its history, its current revision) is never pruned.
A revision older than the cutoff is kept while a newer kept revision is recorded as a
change to it: only revisions below the newest whole-document record older than the
cutoff go, so every kept revision stays readable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import Delete, Engine, delete, func, select, tuple_

from state.documents.codec import Document
from state.storage.tables import events, revisions

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
    ``batch * max_batches`` of each per run; the next run goes on)."""
    return Pruned(
        events=_in_batches(engine, _old_events(cutoff, batch), batch, max_batches),
        revisions=_in_batches(engine, _old_revisions(cutoff, batch), batch, max_batches),
    )


def _in_batches(engine: Engine, statement: Delete, batch: int, max_batches: int) -> int:
    total = 0
    for _ in range(max_batches):
        with engine.begin() as conn:
            deleted = int(conn.execute(statement).rowcount)
        total += deleted
        if deleted < batch:
            break
    return total


def _old_events(cutoff: datetime, batch: int) -> Delete:
    old = events.alias("old")
    victims = select(old.c.session_id, old.c.seq).where(old.c.at < cutoff).limit(batch)
    return delete(events).where(tuple_(events.c.session_id, events.c.seq).in_(victims))


def _old_revisions(cutoff: datetime, batch: int) -> Delete:
    old, base = revisions.alias("old"), revisions.alias("base")
    newest_old_base = (
        select(func.max(base.c.revision))
        .where(
            base.c.session_id == old.c.session_id,
            base.c.doc.is_not(None),
            base.c.at < cutoff,
        )
        .scalar_subquery()
    )
    victims = (
        select(old.c.session_id, old.c.revision)
        .where(old.c.at < cutoff, old.c.revision < newest_old_base)
        .limit(batch)
    )
    return delete(revisions).where(
        tuple_(revisions.c.session_id, revisions.c.revision).in_(victims)
    )
