"""Retention: one run deletes everything due, in short batches, until nothing is due.

- events and revision records older than AGENTSTATE_EVENTS_RETAIN_DAYS (a revision is
  kept while a kept revision is recorded as a change to it: ``state.events.retention``);
- with AGENTSTATE_SESSIONS_RETAIN_DAYS, a session resting (or ended) and untouched that
  long, with nothing queued, and everything of it (``rows.delete_sessions``);
- with AGENTSTATE_WORKFLOWS_RETAIN_DAYS, a workflow finished that long ago with its steps
  and approvals, and decided approvals of sessions that old.

There is no cap per run: a cap lets a backlog grow without bound once turns write faster
than one capped run a period deletes. Each batch is its own short transaction (locks are
held for one batch only, so turns are not stalled), committed without waiting for the
WAL flush on Postgres: a delete lost in a crash is simply due again next run.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from functools import partial

import redis
from sqlalchemy import Connection, Delete, Engine, delete, exists, select, tuple_

from config import Settings
from state.clock import utcnow
from state.events.retention import events_batch, revisions_batch
from state.lifecycle.erase import drop_keys
from state.lifecycle.rows import delete_sessions, delete_workflows, in_batch, pacing
from state.machine import WAITING_PHASES, Phase
from state.storage import keys
from state.storage.tables import approvals, inbox, sessions, workflows
from state.storage.tables_automation import deliveries, schedule_runs

EVENT_BATCH = 5000
# Checkpoints per batch: each one's session loses up to CHECKPOINT_EVERY records (more on
# a first run over a backlog), so a batch deletes a few thousand.
REVISION_BATCH = 200
SESSION_BATCH = 100
WORKFLOW_BATCH = 500
DELETABLE_PHASES = sorted({*WAITING_PHASES, Phase.TIMEOUT, Phase.ERROR})
FINISHED = ("success", "failed", "cancelled")
KINDS = (
    "sessions",
    "messages",
    "inbox",
    "events",
    "revisions",
    "approvals",
    "workflows",
    "steps",
    "quarantine",
    "redis_keys",
)


def prune_all(
    engine: Engine, client: redis.Redis, settings: Settings, now: datetime | None = None
) -> dict[str, int]:
    """Delete all that is due now; rows (and Redis keys) deleted per kind. After each
    batch it pauses as Settings.maintenance_pace says."""
    with pacing(settings.maintenance_pace):
        return _prune_all(engine, client, settings, now or utcnow())


def _prune_all(
    engine: Engine, client: redis.Redis, settings: Settings, now: datetime
) -> dict[str, int]:
    counts: Counter[str] = Counter()
    if settings.sessions_retain_days is not None:
        cutoff = now - timedelta(days=settings.sessions_retain_days)
        counts.update(_prune_sessions(engine, client, cutoff))
    if settings.workflows_retain_days is not None:
        cutoff = now - timedelta(days=settings.workflows_retain_days)
        counts.update(_prune_workflows(engine, cutoff))
    cutoff = now - timedelta(days=settings.events_retain_days)
    counts["events"] += _prune_events(engine, cutoff)
    counts["revisions"] += _prune_revisions(engine, cutoff)
    counts.update(_prune_logs(engine, cutoff))
    return {kind: int(counts[kind]) for kind in (*KINDS, *sorted(set(counts) - set(KINDS)))}


def _prune_sessions(engine: Engine, client: redis.Redis, cutoff: datetime) -> Counter[str]:
    counts: Counter[str] = Counter()
    # Phase by phase, oldest first, each batch from where the one before stopped: a range
    # of ix_sessions_phase_updated, never the sessions kept (nor, again, one with a
    # message queued, passed over).
    for phase in DELETABLE_PHASES:
        after: tuple[datetime, str] | None = None
        while True:
            work = partial(_sessions_batch, phase=phase, cutoff=cutoff, after=after)
            found, gone, deleted = in_batch(engine, work, quick_commit=True)
            counts.update(deleted)
            counts["redis_keys"] += drop_keys(client, keys.owned(session_ids=gone))
            if len(found) < SESSION_BATCH:
                break
            after = found[-1]
    return counts


def _sessions_batch(
    conn: Connection, phase: str, cutoff: datetime, after: tuple[datetime, str] | None
) -> tuple[list[tuple[datetime, str]], list[str], Counter[str]]:
    """(the (updated_at, id) of the sessions found due, those deleted, rows per kind)"""
    queued = exists().where(inbox.c.session_id == sessions.c.session_id, inbox.c.state == "queued")
    query = select(sessions.c.updated_at, sessions.c.session_id).where(
        sessions.c.phase == phase, sessions.c.updated_at < cutoff, ~queued
    )
    if after is not None:
        query = query.where(tuple_(sessions.c.updated_at, sessions.c.session_id) > tuple_(*after))
    found = [
        (r[0], str(r[1]))
        for r in conn.execute(
            query.order_by(sessions.c.updated_at, sessions.c.session_id).limit(SESSION_BATCH)
        )
    ]
    # Checked again under the row lock when deleting: a session touched meanwhile stays.
    due = sessions.c.phase.in_(DELETABLE_PHASES) & (sessions.c.updated_at < cutoff) & ~queued
    gone, deleted, _ = delete_sessions(conn, [session_id for _, session_id in found], due)
    return found, gone, deleted


def _prune_workflows(engine: Engine, cutoff: datetime) -> Counter[str]:
    counts: Counter[str] = Counter()
    due = workflows.c.status.in_(FINISHED) & (workflows.c.finished_at < cutoff)

    def one_batch(conn: Connection) -> tuple[int, Counter[str]]:
        batch = [
            str(r[0])
            for r in conn.execute(select(workflows.c.workflow_id).where(due).limit(WORKFLOW_BATCH))
        ]
        return len(batch), delete_workflows(conn, batch)

    while True:
        found, deleted = in_batch(engine, one_batch, quick_commit=True)
        counts.update(deleted)
        if found < WORKFLOW_BATCH:
            break
    decided = approvals.c.decision.is_not(None) & (approvals.c.decided_at < cutoff)
    victims = select(approvals.c.approval_id).where(decided).limit(WORKFLOW_BATCH)
    counts["approvals"] += _until_done(
        engine,
        delete(approvals).where(approvals.c.approval_id.in_(victims.scalar_subquery())),
        WORKFLOW_BATCH,
    )
    return counts


def _prune_events(engine: Engine, cutoff: datetime) -> int:
    """Events older than ``cutoff``, oldest first, each batch from where the last ended."""
    total, after = 0, None
    while True:
        deleted, after = in_batch(
            engine,
            partial(events_batch, cutoff=cutoff, batch=EVENT_BATCH, after=after),
            quick_commit=True,
        )
        total += deleted
        if deleted < EVENT_BATCH:
            return total


def _prune_revisions(engine: Engine, cutoff: datetime) -> int:
    """Revision records below each session's newest checkpoint older than ``cutoff``
    (``state.events.retention``: a batch reads only due checkpoints, never kept rows)."""
    total = 0
    while True:
        found, deleted = in_batch(
            engine, lambda conn: revisions_batch(conn, cutoff, REVISION_BATCH), quick_commit=True
        )
        total += deleted
        if found < REVISION_BATCH:
            return total


def _prune_logs(engine: Engine, cutoff: datetime) -> Counter[str]:
    """Schedules' ticks and finished webhook deliveries as old as events (their log)."""
    counts: Counter[str] = Counter()
    old_runs = select(schedule_runs.c.schedule_id, schedule_runs.c.tick).where(
        schedule_runs.c.fired_at < cutoff
    )
    runs = delete(schedule_runs).where(
        tuple_(schedule_runs.c.schedule_id, schedule_runs.c.tick).in_(old_runs.limit(EVENT_BATCH))
    )
    counts["schedule_runs"] += _until_done(engine, runs, EVENT_BATCH)
    finished = deliveries.c.status != "pending"
    old = select(deliveries.c.delivery_id).where(finished, deliveries.c.created_at < cutoff)
    sent = delete(deliveries).where(
        deliveries.c.delivery_id.in_(old.limit(EVENT_BATCH).scalar_subquery())
    )
    counts["webhook_deliveries"] += _until_done(engine, sent, EVENT_BATCH)
    return counts


def _until_done(engine: Engine, statement: Delete, batch: int) -> int:
    total = 0
    while True:
        deleted = in_batch(
            engine, lambda conn: int(conn.execute(statement).rowcount), quick_commit=True
        )
        total += deleted
        if deleted < batch:
            return total
