"""The ``approvals`` table, inside a caller's transaction.

An approval is decided by one guarded update (``decision IS NULL``): whoever runs it
first wins, and every later decision changes nothing and is told who won.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, insert, select, update

from state import ids
from state.clock import iso, utcnow
from state.documents import codec
from state.documents.codec import Document
from state.events import log
from state.sessions.snapshot import NewEvent
from state.storage.tables import approvals

EXPIRED_BY = "expired"
# Every ``by`` the system writes when nobody decided (expiry, a cancel, a skipped step, a
# turn that ended otherwise): a person may not claim one, or a forged "cancelled" would
# read as the system's. Compared after NFKC and casefold, so fullwidth or
# differently cased forms are refused too.
RESERVED_BY = frozenset({EXPIRED_BY, "cancelled", "skipped", "turn ended", "rejected", "system"})


def is_reserved_by(by: str) -> bool:
    """Whether ``by`` reads as one of the system's markers (RESERVED_BY)."""
    folded = " ".join(unicodedata.normalize("NFKC", by).casefold().split())
    return folded in RESERVED_BY


class Verdict(StrEnum):
    """What a person (or the clock) decided."""

    APPROVED = "approved"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Decision:
    """One decision, as stored: who, when, with what note."""

    approve: bool
    by: str
    note: str | None = None

    @property
    def verdict(self) -> Verdict:
        """approved or rejected."""
        return Verdict.APPROVED if self.approve else Verdict.REJECTED


@dataclass(frozen=True)
class Subject:
    """What waits for an approval: a turn (``session_id``) or a workflow step."""

    session_id: str | None = None
    user_id: str | None = None
    workflow_id: str | None = None
    step_id: str | None = None


def new_id() -> str:
    """A fresh approval id."""
    return ids.new_id("apr")


def insert_request(
    conn: Connection,
    subject: Subject,
    action: str,
    args: Document,
    ttl_s: float,
    *,
    approval_id: str | None = None,
) -> NewEvent:
    """Store a pending approval (a new id unless given); return its
    ``approval_requested`` event."""
    now = utcnow()
    approval_id = approval_id or new_id()
    expires_at = now + timedelta(seconds=ttl_s)
    conn.execute(
        insert(approvals).values(
            approval_id=approval_id,
            session_id=subject.session_id,
            user_id=subject.user_id,
            workflow_id=subject.workflow_id,
            step_id=subject.step_id,
            action=action,
            args=codec.dumps(args),
            requested_at=now,
            expires_at=expires_at,
        )
    )
    data: Document = {"approval_id": approval_id, "action": action, "args": args}
    data.update(expires_at=iso(expires_at), step_id=subject.step_id)
    data["workflow_id"] = subject.workflow_id
    return NewEvent(log.APPROVAL_REQUESTED, data)


def decide(
    conn: Connection, approval_id: str, decision: Decision, user_id: str | None = None
) -> Document | None:
    """Record ``decision`` if the approval is still undecided, not expired (unless the
    decision is the expiry itself) and ``user_id``'s (if given); return the approval as
    decided, or None if nothing was recorded. The guards are the UPDATE's own WHERE, so a
    racing decision, expiry or owner cannot slip between a check and the write."""
    now = utcnow()
    guards: list[Any] = [approvals.c.approval_id == approval_id, approvals.c.decision.is_(None)]
    if decision.by != EXPIRED_BY:
        guards.append(approvals.c.expires_at > now)
    if user_id is not None:
        guards.append(approvals.c.user_id == user_id)
    row = conn.execute(
        update(approvals)
        .where(*guards)
        .values(
            decision=decision.verdict.value,
            decided_by=decision.by,
            decided_at=now,
            note=decision.note,
        )
        .returning(*approvals.c)
    ).first()
    return None if row is None else document(row)


def decided_event(doc: Document) -> NewEvent:
    """The ``approval_decided`` event of a decided approval."""
    return NewEvent(
        log.APPROVAL_DECIDED,
        {
            "approval_id": doc["approval_id"],
            "approve": doc["approved"],
            "by": doc["by"],
            "note": doc["note"],
            "step_id": doc["step_id"],
            "workflow_id": doc["workflow_id"],
        },
    )


def read(conn: Connection, approval_id: str) -> Document | None:
    """The approval, or None."""
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).first()
    return None if row is None else document(row)


def close_for_session(conn: Connection, session_id: str, by: str) -> None:
    """Reject whatever the session's turn still waits for (the turn ended otherwise)."""
    _close(conn, approvals.c.session_id == session_id, approvals.c.workflow_id.is_(None), by=by)


def close_for_steps(
    conn: Connection, workflow_id: str, step_ids: list[str] | None, by: str
) -> None:
    """Reject the undecided approvals of the workflow's steps (``None``: all of them):
    the steps will never run, so nobody should be asked about them any more."""
    where: list[Any] = [approvals.c.workflow_id == workflow_id]
    if step_ids is not None:
        if not step_ids:
            return
        where.append(approvals.c.step_id.in_(step_ids))
    _close(conn, *where, by=by)


def _close(conn: Connection, *where: Any, by: str) -> None:
    conn.execute(
        update(approvals)
        .where(*where, approvals.c.decision.is_(None))
        .values(decision=Verdict.REJECTED.value, decided_by=by, decided_at=utcnow())
    )


def document(row: Any) -> Document:
    """An approval row as the JSON-ready dict the client returns."""
    decision = row.decision
    return {
        "approval_id": row.approval_id,
        "session_id": row.session_id,
        "user_id": row.user_id,
        "workflow_id": row.workflow_id,
        "step_id": row.step_id,
        "action": row.action,
        "args": codec.loads(row.args),
        "requested_at": iso(row.requested_at),
        "expires_at": iso(row.expires_at),
        "decision": decision,
        "approved": None if decision is None else decision == Verdict.APPROVED,
        "by": row.decided_by,
        "decided_at": iso(row.decided_at),
        "note": row.note,
    }


def expired_before(moment: datetime) -> Any:
    """The WHERE condition of undecided approvals whose time ran out before ``moment``."""
    return (approvals.c.decision.is_(None)) & (approvals.c.expires_at <= moment)
