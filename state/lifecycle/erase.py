"""Erasing a user: every row and every Redis key of the user, their sessions (forks
included: a fork belongs to its source's user) and their workflows.

Rows go in short transactions of a few sessions each (``rows.delete_sessions``), so a user
with many sessions never holds locks for long; erasing again finds nothing and deletes
nothing. A turn in flight cannot write anything back: its commit is a guarded update of
the session row, which is gone, so its whole transaction rolls back. Its Redis writes
happen only after a commit, or after a read that preceded the erasure; the keys are
deleted once the rows are gone and once more after ``GRACE_S``, for a cache write that
was already on its way.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from functools import partial
from typing import Any

import redis
from sqlalchemy import Connection, Engine, Select, delete, select, tuple_

from state.ids import validate_id
from state.lifecycle.rows import (
    delete_sessions,
    delete_workflows,
    in_batch,
    keyed_by,
    kind_of,
    pacing,
)
from state.storage import keys
from state.storage.tables import quarantine, sessions, workflows
from state.storage.tables_automation import schedule_runs, schedules, webhooks

BATCH = 50
# Longer than a commit's way from the database to its cache write (milliseconds).
GRACE_S = 0.25
KINDS = (
    "sessions",
    "messages",
    "inbox",
    "events",
    "revisions",
    "approvals",
    "workflows",
    "steps",
    "user_state",
    "quarantine",
    "schedules",
    "schedule_runs",
    "webhooks",
    "webhook_deliveries",
    "redis_keys",
)


def erase_user(
    engine: Engine, client: redis.Redis, user_id: str, pace: float = 0.0
) -> dict[str, int]:
    """Delete everything of ``user_id``; returns the rows (and Redis keys) deleted per
    kind, every kind present (all zero when there was nothing left). After each batch
    it pauses ``pace`` times the batch's time (Settings.maintenance_pace)."""
    validate_id(user_id, "user")
    with pacing(pace):
        return _erase(engine, client, user_id)


def _erase(engine: Engine, client: redis.Redis, user_id: str) -> dict[str, int]:
    counts: Counter[str] = Counter()
    owned: list[str] = keys.owned(user_id=user_id)
    # Schedules first: a tick firing meanwhile (it holds the schedule's row) commits before
    # this, and its message or workflow is then deleted with the rest; none fires after.
    counts.update(in_batch(engine, partial(_automation_rows, user_id=user_id)))
    sessions_left = Walk(sessions.c.created_at, sessions.c.session_id, sessions.c.user_id)
    while True:
        found, gone, deleted = in_batch(
            engine, partial(_sessions_batch, user_id=user_id, walk=sessions_left)
        )
        counts.update(deleted)
        owned += keys.owned(session_ids=gone)
        if not found and sessions_left.again():
            break
    # The user's workflows of no session.
    workflows_left = Walk(workflows.c.created_at, workflows.c.workflow_id, workflows.c.user_id)
    while True:
        found_any, deleted = in_batch(
            engine, partial(_workflows_batch, user_id=user_id, walk=workflows_left)
        )
        counts.update(deleted)
        if not found_any and workflows_left.again():
            break
    counts.update(in_batch(engine, partial(_user_rows, user_id=user_id)))
    counts["redis_keys"] += drop_keys(client, owned)
    if any(counts.values()):  # something was there: a late cache write may be on its way
        time.sleep(GRACE_S)
        counts["redis_keys"] += drop_keys(client, owned)
    return {kind: int(counts[kind]) for kind in (*KINDS, *sorted(set(counts) - set(KINDS)))}


def _automation_rows(conn: Connection, user_id: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for table in (schedules, schedule_runs, webhooks):
        counts[table.name] += conn.execute(delete(table).where(table.c.user_id == user_id)).rowcount
    return counts


class Walk:
    """A keyset position in the user's rows by (created_at, id), the order of their index
    (``ix_sessions_user_created``, ``ix_workflows_user_created``): each batch starts
    where the one before ended instead of reading again, from the start, past the index
    entries of every row it already deleted. When it runs out it goes back to the start
    once (:meth:`again`), for a row created meanwhile with an earlier time (or a batch
    run again after a deadlock, past which the position had moved)."""

    def __init__(self, created: Any, ident: Any, owner: Any) -> None:
        self.created, self.ident, self.owner = created, ident, owner
        self.after: tuple[datetime, str] | None = None

    def next_ids(self, conn: Connection, user_id: str) -> list[str]:
        """The ids of the user's next batch of rows (and the position moves past them)."""
        rows = conn.execute(self.query(user_id)).all()
        if rows:
            self.after = (rows[-1][0], str(rows[-1][1]))
        return [str(r[1]) for r in rows]

    def query(self, user_id: str) -> Select[Any]:
        """The select of the next batch."""
        query = select(self.created, self.ident).where(self.owner == user_id)
        if self.after is not None:
            query = query.where(tuple_(self.created, self.ident) > tuple_(*self.after))
        return query.order_by(self.created, self.ident).limit(BATCH)

    def again(self) -> bool:
        """Whether the walk is over (it found nothing from the start either); if not, it
        starts over."""
        if self.after is None:
            return True
        self.after = None
        return False


def _sessions_batch(
    conn: Connection, user_id: str, walk: Walk
) -> tuple[bool, list[str], Counter[str]]:
    """(whether any session of the user was left, those deleted, rows deleted per kind)"""
    batch = walk.next_ids(conn, user_id)
    gone, deleted, _ = delete_sessions(conn, batch, forks_too=True)
    return bool(batch), gone, deleted


def _workflows_batch(conn: Connection, user_id: str, walk: Walk) -> tuple[bool, Counter[str]]:
    batch = walk.next_ids(conn, user_id)
    return bool(batch), delete_workflows(conn, batch)


def _user_rows(conn: Connection, user_id: str) -> Counter[str]:
    """Approvals, user state: whatever else names the user."""
    counts: Counter[str] = Counter()
    for table in keyed_by("user_id"):
        counts[kind_of(table)] += conn.execute(
            delete(table).where(table.c.user_id == user_id)
        ).rowcount
    counts["quarantine"] += conn.execute(
        delete(quarantine).where(quarantine.c.kind == "user_state", quarantine.c.key == user_id)
    ).rowcount
    return counts


def drop_keys(client: redis.Redis, names: list[str], chunk: int = 500) -> int:
    """Delete ``names`` (one command per key: on Redis Cluster they live on many slots)."""
    deleted = 0
    for start in range(0, len(names), chunk):
        with client.pipeline(transaction=False) as pipe:
            for name in names[start : start + chunk]:
                pipe.delete(name)
            deleted += sum(int(n) for n in pipe.execute())
    return deleted
