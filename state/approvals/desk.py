"""Deciding approvals: the decision and what it changes commit together, once.

A turn's approval is decided in the commit that moves the turn on (to ``executing`` or
``generating``); a step's in the transaction that lets the step run, or fails it and
skips its dependents. Whoever commits first wins; every other decision, racing or late,
raises ApprovalAlreadyDecidedError and changes nothing. Beat rejects approvals nobody
decided in time (``by == "expired"``) through the same path.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime
from functools import partial
from typing import Any, NoReturn

from sqlalchemy import Engine, select

from state import paging
from state.approvals import rows
from state.approvals.rows import EXPIRED_BY, Decision
from state.clock import utcnow
from state.documents.codec import Document
from state.errors import ApprovalAlreadyDecidedError, ApprovalExpiredError, NotFoundError
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

    def decide(self, approval_id: str, decision: Decision, user_id: str | None = None) -> Document:
        """Record ``decision`` and apply it (see the module docstring); return the
        approval as decided.

        With ``user_id``, another user's approval is an unknown id (NotFoundError). At or
        after ``expires_at`` a person's decision is refused with ApprovalExpiredError and
        the expiry is recorded instead, by the same guarded write that would have taken
        the decision: exactly one outcome is stored whoever races.
        """
        approval = self.get(approval_id)
        if approval is None or (user_id is not None and approval["user_id"] != user_id):
            raise NotFoundError(f"unknown approval {approval_id!r}")
        _require_undecided(approval)
        if decision.by != EXPIRED_BY and _expired(approval):
            self._expire_refusing(approval, user_id)
        try:
            self._apply(approval, decision, user_id)
        except ApprovalAlreadyDecidedError:
            again = self.get(approval_id)
            if again is None or decision.by == EXPIRED_BY:
                raise
            if again["decision"] is None and _expired(again):
                self._expire_refusing(again, user_id)
            _require_undecided(again)
            raise
        decided = self.get(approval_id)
        assert decided is not None
        return decided

    def _apply(self, approval: Document, decision: Decision, user_id: str | None) -> None:
        approval_id = str(approval["approval_id"])
        if approval["workflow_id"]:
            self._decide_step(approval, decision, user_id)
        elif not (
            approval["session_id"]
            and self.interventions.decide_approval(
                approval["session_id"], approval, decision, user_id
            )
        ):
            self._decide_alone(approval_id, decision, user_id)

    def _expire_refusing(self, approval: Document, user_id: str | None) -> None:
        """Record the expiry of ``approval`` (whatever waits for it is rejected), then
        refuse the person's decision: ApprovalExpiredError either way."""
        with contextlib.suppress(ApprovalAlreadyDecidedError):
            self._apply(approval, Decision(approve=False, by=EXPIRED_BY), user_id)
        after = self.get(str(approval["approval_id"])) or approval
        _require_undecided(after)
        raise ApprovalExpiredError(f"approval {approval['approval_id']} expired")

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

    def _decide_alone(self, approval_id: str, decision: Decision, user_id: str | None) -> None:
        # Nothing waits for it any more (its turn ended otherwise): record it, once.
        with self.engine.begin() as conn:
            if rows.decide(conn, approval_id, decision, user_id) is None:
                _refuse(rows.read(conn, approval_id))

    def _decide_step(self, approval: Document, decision: Decision, user_id: str | None) -> None:
        workflow_id = str(approval["workflow_id"])
        # A rejection skips the step's dependents, rows a sibling's success may hold while
        # it waits for the workflow's: after a deadlock the decision runs again.
        applied = retried_on_conflict(partial(self._step_decided, approval, decision, user_id))
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
        self, approval: Document, decision: Decision, user_id: str | None
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
            decided = rows.decide(conn, str(approval["approval_id"]), decision, user_id)
            if decided is None:
                _refuse(rows.read(conn, str(approval["approval_id"])))
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
        kind = ApprovalExpiredError if approval["by"] == EXPIRED_BY else ApprovalAlreadyDecidedError
        raise kind(
            f"approval {approval['approval_id']} was already {approval['decision']} "
            f"by {approval['by']} at {approval['decided_at']}"
        )


def _refuse(approval: Document | None) -> NoReturn:
    """The guarded write recorded nothing: say why (decided already, or expired and not
    yet recorded: the caller records the expiry)."""
    if approval is None:
        raise NotFoundError("unknown approval")
    _require_undecided(approval)
    raise ApprovalAlreadyDecidedError(f"approval {approval['approval_id']} expired")


def _expired(approval: Document) -> bool:
    expires_at = approval.get("expires_at")
    return expires_at is not None and datetime.fromisoformat(str(expires_at)) <= utcnow()
