"""Work that waits, read at scrape time (never on a phase's path): queued messages,
undecided approvals and the oldest one's age, steps held back for their fair share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import false, func, select
from sqlalchemy.engine import Engine

from state import backlog
from state.clock import utcnow
from state.storage.db import read_connection
from state.storage.tables import approvals, inbox
from state.storage.tables_automation import deliveries, schedules


@dataclass(frozen=True)
class Waiting:
    """How much work waits, and for how long the oldest approval has."""

    inbox_depth: int
    approvals_pending: int
    oldest_approval_age_s: float
    steps_waiting: int
    schedules_active: int = 0
    deliveries_pending: int = 0


def waiting(engine: Engine) -> Waiting:
    """Three counting reads (each on an index) and the fair-share backlog."""
    with read_connection(engine) as conn:
        queued = conn.execute(
            select(func.count()).select_from(inbox).where(inbox.c.state == "queued")
        ).scalar_one()
        pending, oldest = conn.execute(
            select(func.count(), func.min(approvals.c.requested_at)).where(
                approvals.c.decision.is_(None)
            )
        ).one()
        active = conn.execute(
            select(func.count()).select_from(schedules).where(schedules.c.paused == false())
        ).scalar_one()
        outbox = conn.execute(
            select(func.count()).select_from(deliveries).where(deliveries.c.status == "pending")
        ).scalar_one()
    return Waiting(
        inbox_depth=int(queued),
        approvals_pending=int(pending),
        oldest_approval_age_s=_age_s(oldest),
        steps_waiting=backlog.steps_waiting(engine),
        schedules_active=int(active),
        deliveries_pending=int(outbox),
    )


def _age_s(at: datetime | None) -> float:
    if at is None:
        return 0.0
    if at.tzinfo is None:  # SQLite hands back naive UTC
        at = at.replace(tzinfo=UTC)
    return max(0.0, (utcnow() - at).total_seconds())
