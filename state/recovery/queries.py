"""The SQL of recovery and maintenance: finding stuck work, counting recoveries, expiry.

Only the recovery sweep and the periodic tasks use it, so it lives outside the stores.
"""

from __future__ import annotations

import time
from datetime import datetime

from sqlalchemy import Engine, Select, and_, or_, select, update

from state import observe
from state.clock import utcnow
from state.events import revisions
from state.machine import RESTING_PHASES, WAITING_PHASES, Phase
from state.session import SessionStatus
from state.sessions.snapshot import InboxState, Snapshot
from state.storage.db import read_connection
from state.storage.tables import inbox, sessions, steps
from state.workflow import WorkflowStepStatus
from state.workflows.guards import step_at

# -- sessions ------------------------------------------------------------------


def stuck_sessions(engine: Engine, cutoff: datetime, limit: int) -> list[str]:
    """Sessions mid-turn that made no progress since ``cutoff`` (one parked until a
    person decides an approval is not stuck: it owes no worker anything)."""
    with read_connection(engine) as conn:
        rows = conn.execute(
            select(sessions.c.session_id)
            .where(
                sessions.c.phase.not_in(tuple(WAITING_PHASES)),
                sessions.c.updated_at < cutoff,
            )
            .order_by(sessions.c.updated_at)
            .limit(limit)
        )
        return [r[0] for r in rows]


def sessions_waiting_in_inbox(engine: Engine, cutoff: datetime, limit: int) -> list[str]:
    """Resting sessions with a message queued since before ``cutoff``, not looked at since
    (its kick may be lost). A recovery attempt touches the session, so each is retried at
    most once per ``stuck_after``."""
    with read_connection(engine) as conn:
        return [r[0] for r in conn.execute(waiting_in_inbox_query(cutoff, limit))]


def waiting_in_inbox_query(cutoff: datetime, limit: int) -> Select[str]:
    """The query :func:`sessions_waiting_in_inbox` runs (its waiting messages are found
    through the partial index of queued ones, ``ix_inbox_session_queued``)."""
    return (
        select(sessions.c.session_id)
        .where(
            sessions.c.phase.in_(tuple(RESTING_PHASES)),
            sessions.c.updated_at < cutoff,
            select(inbox.c.message_id)
            .where(
                inbox.c.session_id == sessions.c.session_id,
                inbox.c.state == InboxState.QUEUED,
                inbox.c.created_at < cutoff,
            )
            .exists(),
        )
        .order_by(sessions.c.updated_at)
        .limit(limit)
    )


def note_session_recovery(engine: Engine, snapshot: Snapshot, *, count: bool = True) -> int | None:
    """Touch the session (and count one recovery if ``count``) at its revision; None if it
    moved on meanwhile."""
    with engine.begin() as conn:
        row = conn.execute(
            update(sessions)
            .where(
                sessions.c.session_id == snapshot.session_id,
                sessions.c.revision == snapshot.revision,
            )
            .values(recoveries=sessions.c.recoveries + int(count), updated_at=utcnow())
            .returning(sessions.c.recoveries)
        ).first()
    return None if row is None else int(row[0])


def note_redelivery(engine: Engine, session_id: str, phase: str, revision: int | None) -> None:
    """Count one recovery of the session if it is still where a redelivered phase task
    expects it (``revision`` if given, and ``phase``, or resting for a turn's start)."""
    where = [sessions.c.session_id == session_id]
    if revision is not None:
        where.append(sessions.c.revision == revision)
    if phase == Phase.UNDERSTANDING:
        where.append(sessions.c.phase.in_(tuple(RESTING_PHASES)))
    else:
        where.append(sessions.c.phase == phase)
    with engine.begin() as conn:
        conn.execute(update(sessions).where(*where).values(recoveries=sessions.c.recoveries + 1))
    observe.current.recovered("redelivery")


def expire_idle_sessions(engine: Engine, cutoff: datetime) -> int:
    """Mark sessions resting since before ``cutoff`` as timed out, each a new revision
    with its record and event; return how many."""
    with engine.begin() as conn:
        rows = conn.execute(
            update(sessions)
            .where(
                sessions.c.phase.in_(tuple(RESTING_PHASES)),
                sessions.c.status.in_((SessionStatus.ACTIVE, SessionStatus.PAUSED)),
                sessions.c.updated_at < cutoff,
                # A message waiting for its turn means the session is in use.
                ~select(inbox.c.message_id)
                .where(
                    inbox.c.session_id == sessions.c.session_id, inbox.c.state == InboxState.QUEUED
                )
                .exists(),
            )
            .values(
                status=SessionStatus.TIMEOUT.value,
                revision=sessions.c.revision + 1,
                event_seq=sessions.c.event_seq + 1,
            )
            .returning(*revisions.BULK_COLUMNS)
        ).all()
        revisions.record_bulk(conn, rows, "expire")
    return len(rows)


# -- workflow steps ------------------------------------------------------------


def stuck_steps(engine: Engine, cutoff: datetime, limit: int) -> list[tuple[str, str, int, str]]:
    """(workflow_id, step_id, revision, status) of steps with no live task."""
    # No live task: a running step whose lease expired, or a ready or retrying step
    # left untouched since ``cutoff``.
    expired_lease = and_(
        steps.c.status == WorkflowStepStatus.RUNNING, steps.c.lease_expires_at < time.time()
    )
    forgotten = and_(
        steps.c.updated_at < cutoff,
        or_(
            and_(steps.c.status == WorkflowStepStatus.PENDING, steps.c.remaining_deps == 0),
            steps.c.status == WorkflowStepStatus.RETRYING,
        ),
    )
    with read_connection(engine) as conn:
        rows = conn.execute(
            select(steps.c.workflow_id, steps.c.step_id, steps.c.revision, steps.c.status)
            .where(or_(expired_lease, forgotten))
            .order_by(steps.c.updated_at)
            .limit(limit)
        )
        return [(r[0], r[1], int(r[2]), r[3]) for r in rows]


def note_step_recovery(
    engine: Engine,
    workflow_id: str,
    step_id: str,
    revision: int,
    *,
    count: bool = True,
    lease_s: float | None = None,
) -> int | None:
    """Count (if ``count``) one recovery of a step at its revision; None if it moved on."""
    values = {"recoveries": steps.c.recoveries + int(count), "updated_at": utcnow()}
    if lease_s is not None:
        # A fresh lease for the re-sent task: the step is not counted again (nor re-sent)
        # while that task may still be waiting in the queue.
        values["lease_expires_at"] = time.time() + lease_s
    with engine.begin() as conn:
        row = conn.execute(
            update(steps)
            .where(*step_at(workflow_id, step_id, revision))
            .values(**values)
            .returning(steps.c.recoveries)
        ).first()
    return None if row is None else int(row[0])


def overdue_steps(engine: Engine, limit: int) -> list[tuple[str, str, int]]:
    """(workflow_id, step_id, revision) of running steps past their ``timeout_s``."""
    with read_connection(engine) as conn:
        rows = conn.execute(
            select(steps.c.workflow_id, steps.c.step_id, steps.c.revision)
            .where(
                steps.c.status == WorkflowStepStatus.RUNNING,
                steps.c.deadline_at < time.time(),
            )
            .order_by(steps.c.deadline_at)
            .limit(limit)
        )
        return [(r[0], r[1], int(r[2])) for r in rows]
