"""What finishing a step does to the rest of its workflow, inside the finishing commit:
its dependents counted down (and those now ready returned), everything downstream of a
failure skipped, and the workflow's counters counted down to its end.
"""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from state.approvals import rows as approval_rows
from state.clock import utcnow
from state.documents import codec
from state.storage.tables import steps, workflows
from state.workflow import WorkflowStatus, WorkflowStepStatus
from state.workflows import control
from state.workflows.records import PENDING_APPROVAL, Finished


def release_dependents(
    conn: Connection, workflow_id: str, dependents: list[str]
) -> list[tuple[str, int, str]]:
    """Count ``dependents`` down; the (step id, revision, action) of those now ready."""
    if not dependents:
        return []
    rows = conn.execute(
        update(steps)
        .where(steps.c.workflow_id == workflow_id, steps.c.step_id.in_(dependents))
        .values(remaining_deps=steps.c.remaining_deps - 1, updated_at=utcnow())
        .returning(
            steps.c.step_id,
            steps.c.remaining_deps,
            steps.c.status,
            steps.c.revision,
            steps.c.action,
            steps.c.approval,
        )
    )
    pending = WorkflowStepStatus.PENDING
    # One that waits for its approval is sent when it is decided, not before.
    return [
        (r[0], int(r[3]), r[4])
        for r in rows
        if r[1] == 0 and r[2] == pending and r[5] != PENDING_APPROVAL
    ]


def skip_downstream(conn: Connection, workflow_id: str, roots: list[str]) -> int:
    downstream = _downstream(conn, workflow_id, roots)
    if not downstream:
        return 0
    approval_rows.close_for_steps(conn, workflow_id, downstream, by="skipped")
    result = conn.execute(
        update(steps)
        .where(
            steps.c.workflow_id == workflow_id,
            steps.c.step_id.in_(downstream),
            steps.c.status.in_((WorkflowStepStatus.PENDING, WorkflowStepStatus.RETRYING)),
        )
        .values(
            status=WorkflowStepStatus.SKIPPED,
            revision=steps.c.revision + 1,
            completed_at=utcnow(),
            updated_at=utcnow(),
            error="a dependency failed",
        )
    )
    return int(result.rowcount)


def _downstream(conn: Connection, workflow_id: str, roots: list[str]) -> list[str]:
    # Level by level: one query per level, each row read once.
    seen = set(roots)
    found: list[str] = []
    frontier = list(roots)
    while frontier:
        rows = conn.execute(
            select(steps.c.dependents).where(
                steps.c.workflow_id == workflow_id, steps.c.step_id.in_(frontier)
            )
        )
        frontier = []
        for (raw,) in rows:
            for child in codec.loads(raw):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    frontier.append(child)
    return found


def count_down(conn: Connection, workflow_id: str, *, done: int, failed: int) -> Finished | None:
    row = conn.execute(
        update(workflows)
        .where(workflows.c.workflow_id == workflow_id)
        .values(
            remaining_steps=workflows.c.remaining_steps - done,
            failed_steps=workflows.c.failed_steps + failed,
            updated_at=utcnow(),
        )
        .returning(
            workflows.c.remaining_steps,
            workflows.c.failed_steps,
            workflows.c.session_id,
            workflows.c.resume_revision,
        )
    ).one()
    if row.remaining_steps > 0:
        return None
    status = WorkflowStatus.FAILED if row.failed_steps else WorkflowStatus.SUCCESS
    conn.execute(
        update(workflows)
        .where(workflows.c.workflow_id == workflow_id)
        .values(status=status, finished_at=utcnow())
    )
    finished = Finished(workflow_id, status, row.session_id, row.resume_revision)
    control.tell_session(conn, finished)
    return finished
