"""Creating a workflow: its row, its steps, and the approval requests of the steps that
need one, inside the caller's transaction."""

from __future__ import annotations

from sqlalchemy import Connection, insert, select

from state.approvals import quota
from state.approvals import rows as approval_rows
from state.clock import utcnow
from state.errors import WorkflowSessionNotFoundError
from state.sessions.snapshot import NewEvent
from state.storage.tables import sessions, steps, workflows
from state.workflow import WorkflowState, WorkflowStatus
from state.workflows.records import Dispatch, step_row

_INSERT_BATCH = 1000


def insert_workflow(
    conn: Connection,
    wf: WorkflowState,
    resume_revision: int | None = None,
    *,
    approval_ttl_s: float,
    user_id: str | None = None,
    max_pending_approvals: int | None = None,
) -> tuple[list[Dispatch], list[NewEvent]]:
    """Store ``wf`` inside an open transaction, with an approval request for each step
    that needs one (expiring after ``approval_ttl_s``); return its root steps to dispatch
    and the ``approval_requested`` events for the session's log.

    The owner is the session's user; a workflow of no session is ``user_id``'s (None:
    the trusted caller's, nobody's). A ``session_id`` that does not exist, or is not
    ``user_id``'s, raises WorkflowSessionNotFoundError: the check reads the session in
    this transaction, so nothing is stored for a session that is not the caller's.
    ``max_pending_approvals`` caps the owner's undecided approvals (``state.approvals.quota``).
    A phase's commit calls it to start the workflow its handler asked for, so the
    workflow exists exactly when the phase that wants it does.
    """
    now = utcnow()
    if wf.session_id:
        owner = conn.execute(
            select(sessions.c.user_id).where(sessions.c.session_id == wf.session_id)
        ).scalar()
        if owner is None or (user_id is not None and owner != user_id):
            raise WorkflowSessionNotFoundError(f"unknown session {wf.session_id!r}")
        user_id = owner
    asking = sum(1 for step in wf.steps.values() if step.approval)
    quota.reserve(conn, user_id, asking, max_pending_approvals)
    generation = conn.execute(
        insert(workflows)
        .values(
            workflow_id=wf.workflow_id,
            session_id=wf.session_id,
            user_id=user_id,
            status=WorkflowStatus.RUNNING,
            context=wf.context,
            total_steps=len(wf.steps),
            remaining_steps=len(wf.steps),
            failed_steps=0,
            resume_revision=resume_revision,
            spec_hash=wf.spec_hash,
            created_at=now,
            updated_at=now,
        )
        .returning(workflows.c.generation)
    ).scalar_one()
    # The steps carry their workflow's generation: a claim returns it with the step.
    rows = [
        {**step_row(wf.workflow_id, step, now, user_id), "generation": generation}
        for step in wf.steps.values()
    ]
    for start in range(0, len(rows), _INSERT_BATCH):
        conn.execute(insert(steps), rows[start : start + _INSERT_BATCH])
    # A step that waits for its approval is sent when it is decided, not before.
    roots = [(step.step_id, 0) for step in wf.get_ready_steps() if not step.approval]
    return roots, _request_approvals(conn, wf, approval_ttl_s, user_id)


def _request_approvals(
    conn: Connection, wf: WorkflowState, ttl_s: float, user_id: str | None
) -> list[NewEvent]:
    asking = [step for step in wf.steps.values() if step.approval]
    return [
        approval_rows.insert_request(
            conn,
            approval_rows.Subject(wf.session_id, user_id, wf.workflow_id, step.step_id),
            step.action,
            step.inputs,
            ttl_s,
        )
        for step in asking
    ]
