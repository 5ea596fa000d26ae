"""The outbox: a delivery row per hook that wants an event, written in the transaction of
the change the event tells. The database writes those of turns, approvals and workflows
itself (the triggers of migration 0020, on every path that writes those rows);
:func:`enqueue` writes the others (``schedule.fired``), in its caller's transaction.
"""

from __future__ import annotations

import uuid
from enum import StrEnum

from sqlalchemy import ColumnElement, Connection, insert, or_, select

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.storage.tables_automation import deliveries, webhooks


class WebhookEvent(StrEnum):
    """What a hook may hear (the ``type`` of a delivery's body)."""

    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    WORKFLOW_COMPLETED = "workflow.completed"
    WORKFLOW_FAILED = "workflow.failed"
    SCHEDULE_FIRED = "schedule.fired"


class DeliveryStatus(StrEnum):
    """Where a delivery is."""

    PENDING = "pending"  # due, or waiting for its next attempt, or being sent
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # every attempt failed, or its hook was disabled (410) or removed


def new_delivery_id() -> str:
    """A delivery id, which is also its ``webhook-id`` header (no ``.``: it is signed)."""
    return f"msg_{uuid.uuid4().hex}"


def enqueue(
    conn: Connection,
    event: WebhookEvent,
    user_id: str | None,
    data: Document,
    session_id: str | None = None,
) -> int:
    """A delivery for each enabled hook that wants ``event`` and may hear about
    ``user_id`` (its own hooks and the operator's) and ``session_id`` (a hook limited to a
    session hears that session only); returns how many. Inside the caller's transaction."""
    now = utcnow()
    owners: ColumnElement[bool] = webhooks.c.user_id.is_(None)
    if user_id is not None:
        owners = or_(owners, webhooks.c.user_id == user_id)
    sessions: ColumnElement[bool] = webhooks.c.session_id.is_(None)
    if session_id is not None:
        sessions = or_(sessions, webhooks.c.session_id == session_id)
    rows = conn.execute(
        select(webhooks.c.webhook_id, webhooks.c.events).where(
            webhooks.c.enabled.is_(True), owners, sessions
        )
    ).all()
    wanted = [str(r.webhook_id) for r in rows if event.value in codec.loads(r.events)]
    if not wanted:
        return 0
    body = {"type": event.value, "timestamp": now.isoformat().replace("+00:00", "Z"), "data": data}
    conn.execute(
        insert(deliveries),
        [
            {
                "delivery_id": new_delivery_id(),
                "webhook_id": webhook_id,
                "user_id": user_id,
                "event": event.value,
                "payload": codec.dumps(body),
                "status": DeliveryStatus.PENDING.value,
                "tries": 0,
                "next_at": now.timestamp(),
                "claim": None,
                "attempts": "[]",
                "created_at": now,
                "updated_at": now,
            }
            for webhook_id in wanted
        ],
    )
    return len(wanted)
