"""Layer 2 storage: workflows and their steps, with guarded status changes.

A step's ``revision`` changes with every status change and every task carries the revision
it expects, so a duplicate delivery finds the revision moved and does nothing. Finishing
a step touches only the step, its direct dependents and the workflow's counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine, func, or_, select, update

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.events import log
from state.storage.db import is_postgres, read_connection, retried_on_conflict
from state.storage.prepared import PREPARED, Statements
from state.storage.tables import steps
from state.workflow import WorkflowState, WorkflowStepStatus
from state.workflows import control, propagation
from state.workflows.creation import insert_workflow
from state.workflows.fairshare import lock_owner, under_cap
from state.workflows.fleet import lock_fleet
from state.workflows.guards import (
    awaiting,
    claim_guard,
    require_one,
    step_at,
    unclaimed_guard,
)
from state.workflows.reads import CLAIM_COLUMNS, WorkflowReads
from state.workflows.records import (
    APPROVED,
    REJECTED,
    ClaimedStep,
    Completion,
    Dispatch,
    Finished,
    claimed_from_row,
)

# AGENTSTATE_APPROVAL_TTL's default, for callers without Settings.
DEFAULT_APPROVAL_TTL_S = 86400.0
_CLAIMABLE = (WorkflowStepStatus.PENDING, WorkflowStepStatus.RETRYING, WorkflowStepStatus.RUNNING)


class WorkflowStore(WorkflowReads):
    """SQL for workflows; every status change is guarded by the step's revision.

    The portable implementation; ``state.workflows.store_postgres.PostgresWorkflowStore``
    overrides the claim and the success with one prepared statement each.
    """

    @staticmethod
    def for_engine(engine: Engine, statements: Statements | None = None) -> WorkflowStore:
        """The store implementation for ``engine``'s database (``statements``: how the
        Postgres store sends its statements, see ``Backend.statements``)."""
        if is_postgres(engine):
            from state.workflows.store_postgres import PostgresWorkflowStore

            return PostgresWorkflowStore(engine, statements or PREPARED)
        return WorkflowStore(engine)

    def create(
        self,
        wf: WorkflowState,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        *,
        user_id: str | None = None,
        max_pending_approvals: int | None = None,
    ) -> list[Dispatch]:
        """Store a validated workflow (and its approval requests, told in its session's
        log) owned by its session's user or ``user_id`` (see ``insert_workflow``); return
        its root steps to dispatch."""
        with self.engine.begin() as conn:
            roots, asked = insert_workflow(
                conn,
                wf,
                approval_ttl_s=approval_ttl_s,
                user_id=user_id,
                max_pending_approvals=max_pending_approvals,
            )
            if wf.session_id:
                log.append(conn, wf.session_id, asked)
            return roots

    # -- running a step --------------------------------------------------------

    def claim(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        lease_s: float,
        task_id: str | None = None,
        *,
        cap: int = 0,
        owner: str = "",
        fleet_cap: int = 0,
    ) -> ClaimedStep | None:
        """Mark the step running if it is still at ``revision`` and runnable now (its
        timer, if any, has run out, its ``owner`` runs fewer than ``cap`` steps and the
        fleet fewer than ``fleet_cap``; 0: no cap); None if not (a duplicate, not due
        yet, or over its owner's share or the fleet's)."""
        now = time.time()
        with self.engine.begin() as conn:
            if cap:  # one claim per owner at a time: the count holds
                lock_owner(conn, owner)
            if fleet_cap:  # and one capped claim in the fleet at a time
                lock_fleet(conn)
            row = conn.execute(
                update(steps)
                .where(
                    *step_at(workflow_id, step_id, revision),
                    steps.c.status.in_(_CLAIMABLE),
                    steps.c.remaining_deps == 0,
                    or_(steps.c.not_before_s.is_(None), steps.c.ready_at <= now),
                    or_(steps.c.approval.is_(None), steps.c.approval == APPROVED),
                    under_cap(cap, fleet_cap),
                )
                .values(
                    status=WorkflowStepStatus.RUNNING,
                    revision=revision + 1,
                    started_at=utcnow(),
                    updated_at=utcnow(),
                    lease_expires_at=now + lease_s,
                    deadline_at=now + steps.c.timeout_s,
                    last_task_id=task_id,
                )
                .returning(*CLAIM_COLUMNS)
            ).first()
        return None if row is None else claimed_from_row(workflow_id, step_id, revision + 1, row)

    def heartbeat(self, claimed: ClaimedStep, lease_s: float) -> bool:
        """Extend the claim's lease; False if the step was taken over meanwhile."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(steps)
                .where(*claim_guard(claimed))
                .values(lease_expires_at=time.time() + lease_s, updated_at=utcnow())
            )
        return result.rowcount == 1

    def succeed(self, claimed: ClaimedStep, outputs: Document) -> Completion:
        """running -> success; dependents whose last dependency this was become ready."""
        return self._succeed(claimed, outputs, claim_guard(claimed))

    # -- a quick action's step: read, run, one commit --------------------------

    def peek(self, workflow_id: str, step_id: str, revision: int) -> ClaimedStep | None:
        """The step as its claim would return it, without writing: None unless it is
        pending or retrying at ``revision``, ready, and waits for no timer, approval
        or timeout (those need the claim). A quick action runs from this, and
        :meth:`succeed_unclaimed` is the step's one commit."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(*CLAIM_COLUMNS, steps.c.dependents).where(
                    *unclaimed_guard(workflow_id, step_id, revision),
                    steps.c.remaining_deps == 0,
                    steps.c.not_before_s.is_(None),
                    steps.c.timeout_s.is_(None),
                    or_(steps.c.approval.is_(None), steps.c.approval == APPROVED),
                )
            ).first()
        if row is None:
            return None
        claimed = claimed_from_row(workflow_id, step_id, revision, row)
        return replace(claimed, dependents=codec.loads(row.dependents))

    def succeed_unclaimed(self, peeked: ClaimedStep, outputs: Document) -> Completion:
        """pending|retrying -> success from :meth:`peek`; StaleStateError if the step moved
        meanwhile (another delivery committed it first, or it was cancelled)."""
        guard = unclaimed_guard(peeked.workflow_id, peeked.step_id, peeked.revision)
        return self._succeed(peeked, outputs, guard)

    @property
    def verifies_carried(self) -> bool:
        """Whether :meth:`succeed_carried` binds what a message carried to the row (the
        portable store carries nothing: its completions name no carried steps)."""
        return False

    def succeed_carried(self, step: ClaimedStep, carried: str, outputs: Document) -> Completion:
        """A quick step's success from what its message carried (where verified)."""
        raise NotImplementedError("this store does not verify carried steps")

    def _succeed(self, claimed: ClaimedStep, outputs: Document, guard: Iterable[Any]) -> Completion:
        # A step's outcome is committed again, never re-run, when Postgres ends its
        # transaction to break a deadlock (see :func:`retried_on_conflict`).
        return retried_on_conflict(partial(self._succeed_once, claimed, outputs, guard))

    def _succeed_once(
        self, claimed: ClaimedStep, outputs: Document, guard: Iterable[Any]
    ) -> Completion:
        with self.engine.begin() as conn:
            dependents = self._finish_step(
                conn, claimed, WorkflowStepStatus.SUCCESS, outputs=outputs, guard=guard
            )
            released = propagation.release_dependents(conn, claimed.workflow_id, dependents)
            finished = propagation.count_down(conn, claimed.workflow_id, done=1, failed=0)
        ready = [(step_id, revision) for step_id, revision, _ in released]
        actions = {step_id: action for step_id, _, action in released}
        return Completion(claimed.workflow_id, ready, finished, actions)

    def retry(self, claimed: ClaimedStep, error: str) -> int:
        """running -> retrying (retry_count + 1); return the revision to dispatch at."""
        return retried_on_conflict(partial(self._retry_once, claimed, error))

    def _retry_once(self, claimed: ClaimedStep, error: str) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(
                update(steps)
                .where(*claim_guard(claimed))
                .values(
                    status=WorkflowStepStatus.RETRYING,
                    retry_count=claimed.retry_count + 1,
                    error=error,
                    revision=claimed.revision + 1,
                    lease_expires_at=None,
                    deadline_at=None,
                    updated_at=utcnow(),
                    last_task_id=claimed.task_id,
                )
            )
            require_one(result.rowcount, claimed)
        return claimed.revision + 1

    def cancel_workflow(self, workflow_id: str, user_id: str | None = None) -> Finished | None:
        """Cancel a running workflow (``user_id``'s, if given) in one transaction; None if
        it was not running. It locks the workflow's row, then its open steps, where a
        step's success locks its own rows first: after a deadlock between the two it runs
        again."""
        return retried_on_conflict(partial(control.cancel, self.engine, workflow_id, user_id))

    def retry_workflow(
        self,
        workflow_id: str,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        user_id: str | None = None,
        max_pending_approvals: int | None = None,
    ) -> list[Dispatch] | None:
        """Reopen a failed or cancelled workflow (``user_id``'s, if given) in one
        transaction; return the steps ready now, or None if it was neither (run again
        after a deadlock, as a cancel is)."""
        reopen = partial(
            control.retry,
            self.engine,
            workflow_id,
            control.Asking(approval_ttl_s, max_pending_approvals),
            user_id,
        )
        return retried_on_conflict(reopen)

    def arm_timer(self, workflow_id: str, step_id: str, revision: int) -> float | None:
        """Start a ready step's durable timer (once); return when it runs out, or None if
        the step has no timer or is not a ready step at ``revision``."""
        with self.engine.begin() as conn:
            row = conn.execute(
                update(steps)
                .where(
                    *step_at(workflow_id, step_id, revision),
                    steps.c.status == WorkflowStepStatus.PENDING,
                    steps.c.remaining_deps == 0,
                    steps.c.not_before_s.is_not(None),
                )
                .values(
                    ready_at=func.coalesce(steps.c.ready_at, time.time() + steps.c.not_before_s)
                )
                .returning(steps.c.ready_at)
            ).first()
        return None if row is None else float(row[0])

    def approve_in(self, conn: Connection, workflow_id: str, step_id: str) -> Dispatch | None:
        """Let a step that waits for approval run, inside ``conn``'s transaction; return it
        to dispatch if its dependencies are done (else it runs when they are)."""
        row = conn.execute(
            update(steps)
            .where(*awaiting(workflow_id, step_id))
            .values(approval=APPROVED, revision=steps.c.revision + 1, updated_at=utcnow())
            .returning(steps.c.remaining_deps, steps.c.revision)
        ).first()
        if row is None or row.remaining_deps > 0:
            return None
        return step_id, int(row.revision)

    def reject_in(self, conn: Connection, workflow_id: str, step_id: str) -> Completion | None:
        """Fail a step that waits for approval (``error == "rejected"``) and skip its
        dependents, inside ``conn``'s transaction; None if it no longer waits."""
        row = conn.execute(
            update(steps)
            .where(*awaiting(workflow_id, step_id))
            .values(
                status=WorkflowStepStatus.FAILED,
                error=REJECTED,
                approval=REJECTED,
                revision=steps.c.revision + 1,
                completed_at=utcnow(),
                updated_at=utcnow(),
            )
            .returning(steps.c.step_id)
        ).first()
        if row is None:
            return None
        skipped = propagation.skip_downstream(conn, workflow_id, [step_id])
        finished = propagation.count_down(conn, workflow_id, done=1 + skipped, failed=1)
        return Completion(workflow_id, [], finished)

    def fail(self, claimed: ClaimedStep, error: str) -> Completion:
        """running -> failed, and every transitive dependent -> skipped (committed again
        after a deadlock, as a success is)."""
        return retried_on_conflict(partial(self._fail_once, claimed, error))

    def _fail_once(self, claimed: ClaimedStep, error: str) -> Completion:
        with self.engine.begin() as conn:
            self._finish_step(conn, claimed, WorkflowStepStatus.FAILED, error=error)
            skipped = propagation.skip_downstream(conn, claimed.workflow_id, [claimed.step_id])
            finished = propagation.count_down(conn, claimed.workflow_id, done=1 + skipped, failed=1)
        return Completion(claimed.workflow_id, [], finished)

    def _finish_step(
        self,
        conn: Connection,
        claimed: ClaimedStep,
        status: str,
        *,
        outputs: Document | None = None,
        error: str | None = None,
        guard: Iterable[Any] | None = None,
    ) -> list[str]:
        """Apply a final status under the claim (or ``guard``); return the step's
        dependents."""
        values: Document = {
            "status": status,
            "revision": claimed.revision + 1,
            "completed_at": utcnow(),
            "updated_at": utcnow(),
            "lease_expires_at": None,
            "deadline_at": None,
            "error": error,
            "last_task_id": claimed.task_id,
        }
        if outputs is not None:
            values["outputs"] = outputs
        if guard is not None:  # a quick action's step, never claimed: it starts now too
            values["started_at"] = values["updated_at"]
        row = conn.execute(
            update(steps)
            .where(*(claim_guard(claimed) if guard is None else guard))
            .values(**values)
            .returning(steps.c.dependents)
        ).first()
        require_one(0 if row is None else 1, claimed)
        assert row is not None
        dependents: list[str] = codec.loads(row[0])
        return dependents

    # -- recovery --------------------------------------------------------------

    def abandon(self, workflow_id: str, step_id: str, revision: int, reason: str) -> Completion:
        """Fail a step that keeps losing its worker (a poison step)."""
        return self.fail(self.claim_at(workflow_id, step_id, revision), reason)

    def claim_at(self, workflow_id: str, step_id: str, revision: int) -> ClaimedStep:
        """The running step at ``revision`` as its claim, for acting on it from outside
        its task (the sweep); the guarded write that follows decides if it still is."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(*CLAIM_COLUMNS).where(
                    steps.c.workflow_id == workflow_id, steps.c.step_id == step_id
                )
            ).one()
        return claimed_from_row(workflow_id, step_id, revision, row)
