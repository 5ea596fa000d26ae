"""Run control of a whole workflow, each one guarded transaction: cancel (every step not
yet terminal ends skipped) and retry (failed and skipped steps go back to pending).

Both bump the revision of every step they touch, so a task still in the queue, or a
running step's late result, finds its revision moved and changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, or_, select, update

from state.approvals import quota
from state.approvals import rows as approval_rows
from state.clock import utcnow
from state.documents import codec
from state.events import log
from state.sessions.snapshot import NewEvent
from state.storage.tables import steps, workflows
from state.workflow import WorkflowStatus, WorkflowStepStatus
from state.workflows.records import PENDING_APPROVAL, REJECTED, Dispatch, Finished

CANCELLED = "cancelled"
_OPEN = (WorkflowStepStatus.PENDING, WorkflowStepStatus.RUNNING, WorkflowStepStatus.RETRYING)
_RERUN = (WorkflowStepStatus.FAILED, WorkflowStepStatus.SKIPPED)
_RETRYABLE = (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED)


def lock_workflow(conn: Connection, workflow_id: str) -> None:
    """Take the workflow row's lock inside ``conn``'s transaction (a no-op on SQLite,
    whose writers hold the whole database)."""
    conn.execute(
        select(workflows.c.workflow_id)
        .where(workflows.c.workflow_id == workflow_id)
        .with_for_update()
    )


@dataclass(frozen=True)
class Asking:
    """How a retry asks again for the approvals its steps need: their time to live, and
    the owner's quota of undecided approvals (None: not counted)."""

    ttl_s: float
    max_pending: int | None = None


def owned_by(user_id: str | None) -> list[Any]:
    """The WHERE terms of a workflow ``user_id`` may change (none if None: trusted)."""
    return [] if user_id is None else [workflows.c.user_id == user_id]


def cancel(engine: Engine, workflow_id: str, user_id: str | None = None) -> Finished | None:
    """Cancel a running workflow in a transaction of its own, its session told; None if
    it was not running (or not ``user_id``'s)."""
    with engine.begin() as conn:
        finished = cancel_in(conn, workflow_id, user_id)
        if finished is not None:
            tell_session(conn, finished)
        return finished


def retry(
    engine: Engine, workflow_id: str, asking: Asking, user_id: str | None = None
) -> list[Dispatch] | None:
    """:func:`retry_in` in a transaction of its own."""
    with engine.begin() as conn:
        return retry_in(conn, workflow_id, asking, user_id)


def cancel_in(conn: Connection, workflow_id: str, user_id: str | None = None) -> Finished | None:
    """Cancel a running workflow inside ``conn``'s transaction; None if it was not running
    (or, ``user_id`` given, is another user's: the owner is guarded by the UPDATE itself)."""
    now = utcnow()
    row = conn.execute(
        update(workflows)
        .where(
            workflows.c.workflow_id == workflow_id,
            workflows.c.status == WorkflowStatus.RUNNING,
            *owned_by(user_id),
        )
        .values(status=WorkflowStatus.CANCELLED, remaining_steps=0, finished_at=now, updated_at=now)
        .returning(workflows.c.session_id, workflows.c.resume_revision)
    ).first()
    if row is None:
        return None
    approval_rows.close_for_steps(conn, workflow_id, None, by=CANCELLED)
    conn.execute(
        update(steps)
        .where(steps.c.workflow_id == workflow_id, steps.c.status.in_(_OPEN))
        .values(
            status=WorkflowStepStatus.SKIPPED,
            error=CANCELLED,
            revision=steps.c.revision + 1,
            completed_at=now,
            updated_at=now,
            lease_expires_at=None,
            deadline_at=None,
        )
    )
    return Finished(workflow_id, WorkflowStatus.CANCELLED, row.session_id, row.resume_revision)


def tell_session(conn: Connection, finished: Finished) -> None:
    """Append ``workflow_finished`` to the log of the session the workflow belongs to (if
    any), inside ``conn``'s transaction: after the workflow's row, the session's."""
    if finished.session_id:
        data = {"workflow_id": finished.workflow_id, "status": finished.status}
        log.append(conn, finished.session_id, [NewEvent(log.WORKFLOW_FINISHED, data)])


def retry_in(
    conn: Connection, workflow_id: str, asking: Asking, user_id: str | None = None
) -> list[Dispatch] | None:
    """Run a failed or cancelled workflow again from where it stopped, inside ``conn``'s
    transaction; return the steps ready now, or None if it was not failed or cancelled
    (or not ``user_id``'s). A step that needs approval and was not approved is asked
    about again, within the owner's quota (QuotaExceededError rolls it all back)."""
    reopened = conn.execute(
        update(workflows)
        .where(
            workflows.c.workflow_id == workflow_id,
            workflows.c.status.in_(_RETRYABLE),
            *owned_by(user_id),
        )
        .values(
            status=WorkflowStatus.RUNNING, failed_steps=0, finished_at=None, updated_at=utcnow()
        )
        .returning(workflows.c.workflow_id, workflows.c.user_id)
    ).first()
    if reopened is None:
        return None
    by_count = _steps_to_rerun(conn, workflow_id)
    for remaining, step_ids in by_count.items():
        _reset(conn, workflow_id, step_ids, remaining)
    reset = sum(len(ids) for ids in by_count.values())
    rerun = [s for ids in by_count.values() for s in ids]
    _ask_again(conn, workflow_id, rerun, asking, reopened.user_id)
    conn.execute(
        update(workflows)
        .where(workflows.c.workflow_id == workflow_id)
        .values(remaining_steps=reset)
    )
    ready = conn.execute(
        select(steps.c.step_id, steps.c.revision).where(
            steps.c.workflow_id == workflow_id,
            steps.c.step_id.in_(by_count.get(0, [])),
            # One asked about again is sent when it is decided, not before.
            or_(steps.c.approval.is_(None), steps.c.approval != PENDING_APPROVAL),
        )
    )
    return [(r[0], int(r[1])) for r in ready]


def _steps_to_rerun(conn: Connection, workflow_id: str) -> dict[int, list[str]]:
    """Failed and skipped steps, grouped by how many of their dependencies are unfinished."""
    rows = conn.execute(
        select(steps.c.step_id, steps.c.status, steps.c.dependencies).where(
            steps.c.workflow_id == workflow_id
        )
    ).all()
    succeeded = {r.step_id for r in rows if r.status == WorkflowStepStatus.SUCCESS}
    by_count: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        if r.status in _RERUN:
            unfinished = [d for d in codec.loads(r.dependencies) if d not in succeeded]
            by_count[len(unfinished)].append(r.step_id)
    return by_count


def _reset(conn: Connection, workflow_id: str, step_ids: list[str], remaining: int) -> None:
    conn.execute(
        update(steps)
        .where(steps.c.workflow_id == workflow_id, steps.c.step_id.in_(step_ids))
        .values(
            status=WorkflowStepStatus.PENDING,
            remaining_deps=remaining,
            retry_count=0,
            error=None,
            outputs={},
            revision=steps.c.revision + 1,
            recoveries=0,
            started_at=None,
            completed_at=None,
            ready_at=None,
            deadline_at=None,
            lease_expires_at=None,
            updated_at=utcnow(),
        )
    )


def _ask_again(
    conn: Connection, workflow_id: str, step_ids: list[str], asking: Asking, owner: str | None
) -> None:
    candidates = conn.execute(
        select(func.count())
        .select_from(steps)
        .where(
            steps.c.workflow_id == workflow_id,
            steps.c.step_id.in_(step_ids),
            steps.c.approval.in_((PENDING_APPROVAL, REJECTED)),
        )
    ).scalar_one()
    quota.reserve(conn, owner, int(candidates), asking.max_pending)
    asked_rows = conn.execute(
        update(steps)
        .where(
            steps.c.workflow_id == workflow_id,
            steps.c.step_id.in_(step_ids),
            steps.c.approval.in_((PENDING_APPROVAL, REJECTED)),
        )
        .values(approval=PENDING_APPROVAL)
        .returning(steps.c.step_id, steps.c.action, steps.c.inputs)
    ).all()
    if not asked_rows:
        return
    session_id = conn.execute(
        select(workflows.c.session_id).where(workflows.c.workflow_id == workflow_id)
    ).scalar()
    asked = [
        approval_rows.insert_request(
            conn,
            approval_rows.Subject(session_id, owner, workflow_id, row.step_id),
            row.action,
            codec.loads(row.inputs),
            asking.ttl_s,
        )
        for row in asked_rows
    ]
    if session_id:
        log.append(conn, session_id, asked)
