"""The SQL of recovery and maintenance: finding stuck work, counting recoveries, expiry.

Only the recovery sweep and the periodic tasks use it, so it lives outside the stores.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Engine, Select, Table, and_, case, or_, select, update

from state import observe
from state.clock import utcnow
from state.events import revisions
from state.machine import RESTING_PHASES, WAITING_PHASES, Phase
from state.session import SessionStatus
from state.sessions.snapshot import InboxState, Snapshot
from state.storage.db import read_connection
from state.storage.tables import UNATTENDED, inbox, sessions, steps
from state.workflow import WorkflowStepStatus
from state.workflows.guards import step_at

# The sweep's re-sends of one item at one revision back off: the n-th waits
# STUCK_AFTER x 2^n after the one before (at most x RESEND_BACKOFF_MAX), so that work
# merely waiting in a long queue is not sent again and again (a backlog multiplied).
RESEND_BACKOFF_MAX = 16


def resend_due(table: Table) -> ColumnElement[bool]:
    """Whether the sweep may send the row's work again now: never re-sent at its current
    revision, or its back-off has run out."""
    return or_(
        table.c.resent_revision.is_(None),
        table.c.resent_revision != table.c.revision,
        table.c.resend_at.is_(None),
        table.c.resend_at < time.time(),
    )


def resend_values(table: Table, revision: int, stuck_after: float) -> dict[str, object]:
    """The columns a re-send at ``revision`` writes: one more re-send at that revision
    (the first, at another), and when the next one may go."""
    again = table.c.resent_revision == revision
    now = time.time()
    ladder = [
        (and_(again, table.c.resends >= n), now + stuck_after * 2 ** (n + 1)) for n in (3, 2, 1)
    ]
    return {
        "resent_revision": revision,
        "resends": case((again, table.c.resends + 1), else_=1),
        "resend_at": case(*ladder, else_=now + stuck_after * 2),
    }


# -- sessions ------------------------------------------------------------------


# The phases in which a worker owes the session something (every phase but the waiting
# ones), named: ``phase IN (...)`` is a range of ``ix_sessions_phase_updated`` per phase,
# where ``NOT IN`` (waiting) would read every session ever kept.
ACTIVE_PHASES = tuple(sorted(phase.value for phase in Phase if phase not in WAITING_PHASES))


def stuck_sessions(engine: Engine, cutoff: datetime, limit: int) -> list[str]:
    """Sessions mid-turn that made no progress since ``cutoff`` (one parked until a
    person decides an approval is not stuck: it owes no worker anything)."""
    with read_connection(engine) as conn:
        return [r[0] for r in conn.execute(stuck_sessions_query(cutoff, limit))]


def stuck_sessions_query(cutoff: datetime, limit: int) -> Select[Any]:
    """The query :func:`stuck_sessions` runs."""
    return (
        select(sessions.c.session_id)
        .where(
            sessions.c.phase.in_(ACTIVE_PHASES),
            sessions.c.updated_at < cutoff,
            resend_due(sessions),
        )
        .order_by(sessions.c.updated_at)
        .limit(limit)
    )


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
            resend_due(sessions),
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


def note_session_recovery(
    engine: Engine, snapshot: Snapshot, *, count: bool = True, resend_after: float | None = None
) -> int | None:
    """Touch the session (and count one recovery if ``count``) at its revision, and, if
    ``resend_after`` (STUCK_AFTER) is given, note a re-send there (backing off the next);
    the recoveries counted, or None if it moved on meanwhile."""
    values: dict[str, object] = {
        "recoveries": sessions.c.recoveries + int(count),
        "updated_at": utcnow(),
    }
    if resend_after is not None:
        values.update(resend_values(sessions, snapshot.revision, resend_after))
    with engine.begin() as conn:
        row = conn.execute(
            update(sessions)
            .where(
                sessions.c.session_id == snapshot.session_id,
                sessions.c.revision == snapshot.revision,
            )
            .values(**values)
            .returning(sessions.c.recoveries)
        ).first()
    return None if row is None else int(row[0])


def note_redelivery(
    engine: Engine,
    session_id: str,
    phase: str,
    revision: int | None,
    stuck_after: float | None = None,
) -> None:
    """Count one recovery of the session if it is still where a redelivered phase task
    expects it (``revision`` if given, and ``phase``, or resting for a turn's start).

    With ``stuck_after``, the sweep's next re-send backs off as if it had sent this one:
    the broker is delivering the work, and a copy of the sweep's would run it once more
    uncounted (a poison turn would then run more often than AGENTSTATE_MAX_RECOVERIES)."""
    where = [sessions.c.session_id == session_id]
    if revision is not None:
        where.append(sessions.c.revision == revision)
    if phase == Phase.UNDERSTANDING:
        where.append(sessions.c.phase.in_(tuple(RESTING_PHASES)))
    else:
        where.append(sessions.c.phase == phase)
    values: dict[str, object] = {"recoveries": sessions.c.recoveries + 1}
    if stuck_after is not None:
        values.update(resent_revision=sessions.c.revision, resend_at=time.time() + 2 * stuck_after)
    with engine.begin() as conn:
        conn.execute(update(sessions).where(*where).values(**values))
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


def stuck_steps(
    engine: Engine, cutoff: datetime, limit: int, sent_before: datetime | None = None
) -> list[tuple[str, str, int, str]]:
    """(workflow_id, step_id, revision, status) of steps with no live task. With
    ``sent_before`` (the oldest step the broker still holds was sent then), a ready step
    sent after it is still in the queue, not forgotten."""
    with read_connection(engine) as conn:
        rows = conn.execute(stuck_steps_query(cutoff, limit, sent_before))
        return [(r[0], r[1], int(r[2]), r[3]) for r in rows]


def stuck_steps_query(
    cutoff: datetime, limit: int, sent_before: datetime | None = None
) -> Select[Any]:
    """The query :func:`stuck_steps` runs: a running step whose lease expired (among the
    running ones, ``ix_steps_owner_running``), or a ready or retrying step left untouched
    since ``cutoff`` (among those ``ix_steps_unattended`` holds)."""
    expired_lease = and_(
        steps.c.status == WorkflowStepStatus.RUNNING, steps.c.lease_expires_at < time.time()
    )
    # UNATTENDED, spelled as the index's predicate: not one waiting for its approval (the
    # decision sends it), nor one parked for its owner's fair share (it waits in the
    # database, by design). Neither owes a worker anything.
    forgotten = and_(
        UNATTENDED,
        steps.c.updated_at < (cutoff if sent_before is None else min(cutoff, sent_before)),
        or_(
            and_(steps.c.status == WorkflowStepStatus.PENDING, steps.c.remaining_deps == 0),
            steps.c.status == WorkflowStepStatus.RETRYING,
        ),
    )
    return (
        select(steps.c.workflow_id, steps.c.step_id, steps.c.revision, steps.c.status)
        .where(or_(expired_lease, forgotten), resend_due(steps))
        .order_by(steps.c.updated_at)
        .limit(limit)
    )


def note_step_recovery(
    engine: Engine,
    workflow_id: str,
    step_id: str,
    revision: int,
    *,
    count: bool = True,
    lease_s: float | None = None,
) -> int | None:
    """Count (if ``count``) one recovery of a step at its revision, and note a re-send
    there; the recoveries counted, or None if it moved on.

    Only work a worker took and lost counts: a step the sweep already sent again at this
    revision, and that no worker claimed since (a claim moves the revision), merely
    waits in the queue. It is not counted again, and its next re-send backs off."""
    taken = or_(steps.c.resent_revision.is_(None), steps.c.resent_revision != revision)
    counted = case((taken, steps.c.recoveries + 1), else_=steps.c.recoveries) if count else None
    values: dict[str, object] = {
        "recoveries": steps.c.recoveries if counted is None else counted,
        "updated_at": utcnow(),
    }
    if lease_s is not None:
        # A fresh lease for the re-sent task: the step is not counted again (nor re-sent)
        # while that task may still be waiting in the queue.
        values["lease_expires_at"] = time.time() + lease_s
        values.update(resend_values(steps, revision, lease_s))
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
