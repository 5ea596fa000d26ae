"""Deciding approvals: the decision and what it changes commit together, once.

A turn's approval is decided in the commit that moves the turn on (to ``executing`` or
``generating``); a step's in the transaction that lets the step run, or fails it and
skips its dependents. Whoever commits first wins; every other decision, racing or late,
raises ApprovalAlreadyDecidedError and changes nothing. Beat rejects approvals nobody
decided in time (``by == "expired"``) through the same path.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from sqlalchemy import Engine, select

from state import paging
from state.approvals import rows
from state.approvals.rows import EXPIRED_BY, Decision
from state.clock import utcnow
from state.documents.codec import Document
from state.errors import ApprovalAlreadyDecidedError, NotFoundError
from state.events import log
from state.storage.db import read_connection, retried_on_conflict
from state.storage.tables import approvals
from state.turns.interventions import TurnInterventions
from state.workflows.control import lock_workflow
from state.workflows.engine import WorkflowEngine
from state.workflows.records import Completion

logger = logging.getLogger(__name__)

EXPIRE_BATCH = 100


class ApprovalDesk:
    """Lists, decides and expires approvals."""

    def __init__(
        self, engine: Engine, interventions: TurnInterventions, workflows: WorkflowEngine
    ) -> None:
        self.engine = engine
        self.interventions = interventions
        self.workflows = workflows

    def get(self, approval_id: str) -> Document | None:
        """The approval, or None."""
        with read_connection(self.engine) as conn:
            return rows.read(conn, approval_id)

    def list(
        self, user_id: str | None = None, pending: bool = True, limit: int = 100
    ) -> list[Document]:
        """Approvals newest first (only the undecided ones if ``pending``)."""
        query = select(approvals)
        if user_id is not None:
            query = query.where(approvals.c.user_id == user_id)
        if pending:
            query = query.where(approvals.c.decision.is_(None))
        keys = (approvals.c.requested_at, approvals.c.approval_id)
        page = paging.fetch(self.engine, query, keys, rows.document, limit=limit, cursor=None)
        return list(page.items)

    def decide(self, approval_id: str, decision: Decision) -> Document:
        """Record ``decision`` and apply it (see the module docstring); return the
        approval as decided."""
        approval = self.get(approval_id)
        if approval is None:
            raise NotFoundError(f"unknown approval {approval_id!r}")
        _require_undecided(approval)
        if approval["workflow_id"]:
            self._decide_step(approval, decision)
        elif not (
            approval["session_id"]
            and self.interventions.decide_approval(approval["session_id"], approval, decision)
        ):
            self._decide_alone(approval_id, decision)
        decided = self.get(approval_id)
        assert decided is not None
        return decided

    def expire_due(self, limit: int = EXPIRE_BATCH) -> int:
        """Reject (``by == "expired"``) the approvals whose time ran out; return how many."""
        with read_connection(self.engine) as conn:
            due = (
                conn.execute(
                    select(approvals.c.approval_id)
                    .where(rows.expired_before(utcnow()))
                    .order_by(approvals.c.expires_at)
                    .limit(limit)
                )
                .scalars()
                .all()
            )
        expired = 0
        for approval_id in due:
            try:
                self.decide(approval_id, Decision(approve=False, by=EXPIRED_BY))
            except ApprovalAlreadyDecidedError:
                continue  # someone decided it meanwhile: their decision stands
            expired += 1
        return expired

    def _decide_alone(self, approval_id: str, decision: Decision) -> None:
        # Nothing waits for it any more (its turn ended otherwise): record it, once.
        with self.engine.begin() as conn:
            if rows.decide(conn, approval_id, decision) is None:
                _require_undecided(rows.read(conn, approval_id) or {})

    def _decide_step(self, approval: Document, decision: Decision) -> None:
        workflow_id = str(approval["workflow_id"])
        # A rejection skips the step's dependents, rows a sibling's success may hold while
        # it waits for the workflow's: after a deadlock the decision runs again.
        applied = retried_on_conflict(partial(self._step_decided, approval, decision))
        if applied is None:
            return
        ready, completion = applied
        if ready is not None:
            self.workflows.dispatcher.step(workflow_id, *ready)
        if completion is not None:
            self.workflows.follow(completion)
        elif approval["session_id"] and self.workflows.notifier is not None:
            self.workflows.notifier.session(str(approval["session_id"]))

    def _step_decided(
        self, approval: Document, decision: Decision
    ) -> tuple[Any, Completion | None] | None:
        """Record a step's decision and apply it, in one transaction: the step to dispatch
        (approved and ready) and the completion to follow (rejected); None if nothing was
        recorded."""
        workflow_id, step_id = str(approval["workflow_id"]), str(approval["step_id"])
        store = self.workflows.store
        with self.engine.begin() as conn:
            # The workflow's row first: the order every writer of a workflow but a step's
            # success takes.
            lock_workflow(conn, workflow_id)
            decided = rows.decide(conn, str(approval["approval_id"]), decision)
            if decided is None:
                _require_undecided(rows.read(conn, str(approval["approval_id"])) or {})
                return None
            ready: Any = None
            completion: Completion | None = None
            if decision.approve:
                ready = store.approve_in(conn, workflow_id, step_id)
            else:
                completion = store.reject_in(conn, workflow_id, step_id)
            if approval["session_id"]:
                log.append(conn, str(approval["session_id"]), [rows.decided_event(decided)])
            return ready, completion


def _require_undecided(approval: Document) -> None:
    if approval.get("decision"):
        raise ApprovalAlreadyDecidedError(
            f"approval {approval['approval_id']} was already {approval['decision']} "
            f"by {approval['by']} at {approval['decided_at']}"
        )
    if not approval:
        raise NotFoundError("unknown approval")
