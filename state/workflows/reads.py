"""Reads of workflows and steps: what a step needs to run, what a redelivered task left
to do, and the workflow as a document. The writes are in ``state.workflows.store``."""

from __future__ import annotations

import time
from collections import OrderedDict

from sqlalchemy import ColumnElement, Connection, Engine, func, select, true

from state.clock import iso
from state.documents import codec
from state.documents.codec import Document
from state.errors import NotFoundError
from state.storage.db import read_connection
from state.storage.tables import steps, workflows
from state.workflow import WorkflowStatus, WorkflowStepStatus
from state.workflows.records import (
    Completion,
    Dispatch,
    Finished,
    Leftover,
    WorkflowProgress,
    claimed_from_row,
    step_document,
)

CONTEXT_CACHE_SIZE = 256
CLAIM_COLUMNS = (
    steps.c.action,
    steps.c.inputs,
    steps.c.dependencies,
    steps.c.retry_count,
    steps.c.max_retries,
    steps.c.timeout_s,
    steps.c.generation,
)


class WorkflowReads:
    """Reads of one database's workflows (the base of WorkflowStore)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Keyed by (workflow_id, generation): an id that erasure or retention freed and
        # someone took again is another workflow, and never sees this one's context.
        self._contexts: OrderedDict[tuple[str, int], Document] = OrderedDict()

    def leftover(self, workflow_id: str, step_id: str, task_id: str) -> Leftover | None:
        """What an earlier delivery of ``task_id`` committed but may not have followed up
        (its commit landed, its acknowledgement did not); None if it was not ours."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(
                    steps.c.status,
                    steps.c.revision,
                    steps.c.last_task_id,
                    steps.c.lease_expires_at,
                    *CLAIM_COLUMNS,
                ).where(steps.c.workflow_id == workflow_id, steps.c.step_id == step_id)
            ).first()
            if row is None or row.last_task_id != task_id:
                return None
            if row.status == WorkflowStepStatus.RUNNING:
                if (row.lease_expires_at or 0.0) > time.time():
                    return None  # the first delivery may still be running it: leave it be

                return Leftover(
                    claimed=claimed_from_row(workflow_id, step_id, int(row.revision), row)
                )
            if row.status == WorkflowStepStatus.RETRYING:
                return Leftover(retry_revision=int(row.revision))
            dependents = self._dependents_of_successes(conn, workflow_id, task_id)
            ready = self._ready_among(conn, workflow_id, dependents)
            finished = self._finished(conn, workflow_id)
        return Leftover(completion=Completion(workflow_id, ready, finished))

    def _dependents_of_successes(
        self, conn: Connection, workflow_id: str, task_id: str
    ) -> list[str]:
        # Every step this delivery completed, not only the one it was sent for: under
        # the inline policy one delivery runs a chain of quick steps, and a chain cut
        # short left the step after the last commit unsent.
        rows = conn.execute(
            select(steps.c.dependents).where(
                steps.c.workflow_id == workflow_id,
                steps.c.last_task_id == task_id,
                steps.c.status == WorkflowStepStatus.SUCCESS,
            )
        )
        return sorted({step for row in rows for step in codec.loads(row[0])})

    def _ready_among(
        self, conn: Connection, workflow_id: str, candidates: list[str]
    ) -> list[Dispatch]:
        if not candidates:
            return []
        rows = conn.execute(
            select(steps.c.step_id, steps.c.revision).where(
                steps.c.workflow_id == workflow_id,
                steps.c.step_id.in_(candidates),
                steps.c.status == WorkflowStepStatus.PENDING,
                steps.c.remaining_deps == 0,
            )
        )
        return [(r[0], int(r[1])) for r in rows]

    def _finished(self, conn: Connection, workflow_id: str) -> Finished | None:
        row = conn.execute(
            select(workflows.c.status, workflows.c.session_id, workflows.c.resume_revision).where(
                workflows.c.workflow_id == workflow_id
            )
        ).one()
        if row.status not in WorkflowStatus.finished():
            return None
        return Finished(workflow_id, row.status, row.session_id, row.resume_revision)

    def dependency_outputs(self, workflow_id: str, dependencies: list[str]) -> Document:
        """Outputs of the given steps, by step id."""
        if not dependencies:
            return {}
        with read_connection(self.engine) as conn:
            rows = conn.execute(
                select(steps.c.step_id, steps.c.outputs).where(
                    steps.c.workflow_id == workflow_id, steps.c.step_id.in_(dependencies)
                )
            )
            return {r[0]: codec.loads(r[1]) for r in rows}

    def context(self, workflow_id: str, generation: int) -> Document:
        """The shared context of the workflow's ``generation`` (immutable, so cached per
        process); NotFoundError if that generation is gone (erased, pruned)."""
        key = (workflow_id, generation)
        cached = self._contexts.get(key)
        if cached is None:
            with read_connection(self.engine) as conn:
                raw = conn.execute(
                    select(workflows.c.context).where(
                        workflows.c.workflow_id == workflow_id,
                        workflows.c.generation == generation,
                    )
                ).scalar()
            if raw is None:
                raise NotFoundError(f"workflow {workflow_id!r} is gone")
            cached = codec.loads(raw)
            self._contexts[key] = cached
            if len(self._contexts) > CONTEXT_CACHE_SIZE:
                self._contexts.popitem(last=False)
        return dict(cached)

    def status(self, workflow_id: str, user_id: str | None = None) -> str | None:
        """The workflow's status (running, success, failed), or None if unknown (or not
        ``user_id``'s)."""
        with read_connection(self.engine) as conn:
            status = conn.execute(
                select(workflows.c.status).where(
                    workflows.c.workflow_id == workflow_id, visible_to(user_id)
                )
            ).scalar()
        return None if status is None else str(status)

    def document_owner_matches(self, workflow_id: str, user_id: str | None) -> bool:
        """Whether the workflow exists and ``user_id`` (None: anyone) owns it."""
        return self.status(workflow_id, user_id) is not None

    def spec_hash(self, workflow_id: str) -> str | None:
        """The fingerprint of the spec the workflow was started from."""
        with read_connection(self.engine) as conn:
            found = conn.execute(
                select(workflows.c.spec_hash).where(workflows.c.workflow_id == workflow_id)
            ).scalar()
        return None if found is None else str(found)

    def progress(
        self, workflow_id: str, *, user_id: str | None = None, step_counts: bool = False
    ) -> WorkflowProgress | None:
        """The workflow's status and counts, no inputs or outputs (None if unknown, or not
        ``user_id``'s to read); with ``step_counts``, how many steps are in each status."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(
                    workflows.c.status,
                    workflows.c.total_steps,
                    workflows.c.remaining_steps,
                    workflows.c.failed_steps,
                ).where(workflows.c.workflow_id == workflow_id, visible_to(user_id))
            ).first()
            if row is None:
                return None
            counts = None
            if step_counts:
                by_status = conn.execute(
                    select(steps.c.status, func.count())
                    .where(steps.c.workflow_id == workflow_id)
                    .group_by(steps.c.status)
                )
                counts = {str(status): int(n) for status, n in by_status}
        return WorkflowProgress(
            workflow_id, str(row[0]), int(row[1]), int(row[2]), int(row[3]), counts
        )

    def document(self, workflow_id: str, user_id: str | None = None) -> Document | None:
        """The workflow as a JSON-ready dict (status, counts, steps by id); None if unknown,
        or not ``user_id``'s to read (see :func:`visible_to`)."""
        with read_connection(self.engine) as conn:
            wf = conn.execute(
                select(workflows).where(workflows.c.workflow_id == workflow_id, visible_to(user_id))
            ).first()
            if wf is None:
                return None
            rows = conn.execute(select(steps).where(steps.c.workflow_id == workflow_id)).all()
        return {
            "workflow_id": wf.workflow_id,
            "session_id": wf.session_id,
            "status": wf.status,
            "context": codec.loads(wf.context),
            "total_steps": wf.total_steps,
            "remaining_steps": wf.remaining_steps,
            "failed_steps": wf.failed_steps,
            "created_at": iso(wf.created_at),
            "finished_at": iso(wf.finished_at),
            "steps": {row.step_id: step_document(row) for row in rows},
        }


def visible_to(user_id: str | None) -> ColumnElement[bool]:
    """The workflows ``user_id`` may read and change (all of them if None): those it owns
    (``workflows.user_id``, written at creation and never changed). Any other reads as
    an unknown id; a workflow of nobody (started by operator code) is the operator's."""
    if user_id is None:
        return true()
    return workflows.c.user_id == user_id
