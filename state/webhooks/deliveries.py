"""The outbox's rows on their way out: claimed when due, tried, recorded, listed, redelivered.

A delivery is sent by whoever holds its claim: a look for due deliveries (``claim_due``,
``FOR UPDATE SKIP LOCKED``) gives each a fresh claim and pushes ``next_at`` one lease
ahead, then hands (delivery_id, claim) to a sender. The sender renews the lease when it
starts (``start``) and records the attempt under the same claim (``record``): a sender whose
claim was replaced meanwhile records nothing. A sender killed mid-send leaves the row
pending, due again when its lease runs out, so a delivery is never lost; it is at least
once, and always under the same ``webhook-id``, so receivers can drop a repeat.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, false, select, update

from state.clock import iso, utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import NotFoundError, RunStateError
from state.paging import whole_number
from state.storage.db import read_connection
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks import pushes
from state.webhooks.outbox import DeliveryStatus

MAX_PAGE = 1000
MAX_DELAY_S = 3600.0
GONE = 410


@dataclass(frozen=True)
class RetryRules:
    """AGENTSTATE_WEBHOOK_MAX_ATTEMPTS and AGENTSTATE_WEBHOOK_RETRY_BASE_SECONDS."""

    max_attempts: int
    base_s: float

    def delay_s(self, attempt: int) -> float:
        """How long attempt ``attempt`` (1, 2, ...) that failed waits before the next."""
        return float(min(MAX_DELAY_S, self.base_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Attempt:
    """A claimed delivery, ready to send."""

    delivery_id: str
    claim: str
    webhook_id: str
    url: str
    secret: str
    payload: str
    tries: int
    # Headers the hook asks for besides the signature's (an A2A config's token, auth).
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What one attempt got: an HTTP status, or an error (no answer)."""

    status_code: int | None = None
    error: str | None = None

    @property
    def delivered(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300


class DeliveryStore:
    """The ``webhook_deliveries`` table (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def claim_due(self, lease_s: float, limit: int = 100) -> list[tuple[str, str]]:
        """Up to ``limit`` due deliveries nobody holds, each with a fresh claim."""
        now = time.time()
        with self.engine.begin() as conn:
            due = [
                str(r[0])
                for r in conn.execute(
                    select(deliveries.c.delivery_id)
                    .where(deliveries.c.status == DeliveryStatus.PENDING.value)
                    .where(deliveries.c.next_at <= now)
                    .order_by(deliveries.c.next_at)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
            ]
            claimed = [(delivery_id, uuid.uuid4().hex) for delivery_id in due]
            for delivery_id, claim in claimed:
                _hold(conn, delivery_id, claim, now + lease_s)
        return claimed

    def start(self, delivery_id: str, claim: str, lease_s: float) -> Attempt | None:
        """The delivery to send if ``claim`` still holds it (its lease renewed from now);
        None if not (another sender has it, or it was delivered)."""
        held = deliveries.c.claim == claim
        with self.engine.begin() as conn:
            row = conn.execute(
                update(deliveries)
                .where(deliveries.c.delivery_id == delivery_id, held, _pending())
                .values(next_at=time.time() + lease_s)
                .returning(deliveries.c.webhook_id, deliveries.c.payload, deliveries.c.tries)
            ).first()
            if row is None:
                return None
            hook = conn.execute(
                select(
                    webhooks.c.url,
                    webhooks.c.secret,
                    webhooks.c.enabled,
                    webhooks.c.a2a_task,
                    webhooks.c.a2a_token,
                    webhooks.c.a2a_auth,
                ).where(webhooks.c.webhook_id == row.webhook_id)
            ).first()
            if hook is None or not hook.enabled:
                _finish(conn, delivery_id, DeliveryStatus.FAILED, [], "the webhook is disabled")
                return None
        payload = row.payload if isinstance(row.payload, str) else codec.dumps(row.payload)
        headers: dict[str, str] = {}
        if hook.a2a_task is not None:  # an A2A config: the protocol's body, its headers
            # Made from the stored body alone, so every attempt sends the same bytes.
            payload = codec.dumps(pushes.a2a_body(codec.loads(payload), hook.a2a_task))
            headers = pushes.a2a_headers(hook.a2a_token, hook.a2a_auth)
        return Attempt(
            delivery_id,
            claim,
            row.webhook_id,
            hook.url,
            hook.secret,
            payload,
            int(row.tries),
            headers,
        )

    def record(self, attempt: Attempt, outcome: Outcome, rules: RetryRules) -> str:
        """Log the attempt and decide what comes next: delivered, given up, or due again
        after the backoff; a 410 also disables the hook (and fails what it had pending)."""
        entry: Document = {"at": iso(utcnow())}
        if outcome.status_code is not None:
            entry["status_code"] = outcome.status_code
        else:
            entry["error"] = outcome.error or "no answer"
        tries = attempt.tries + 1
        with self.engine.begin() as conn:
            row = conn.execute(
                select(deliveries.c.attempts)
                .where(deliveries.c.delivery_id == attempt.delivery_id)
                .where(deliveries.c.claim == attempt.claim)
                .with_for_update()
            ).first()
            if row is None:  # the claim was taken over (or the hook removed): not ours
                return "stale"
            log = [*_loaded(row.attempts), entry]
            if outcome.delivered:
                return _finish(
                    conn, attempt.delivery_id, DeliveryStatus.DELIVERED, log, None, tries=tries
                )
            if outcome.status_code == GONE:
                _disable(conn, attempt.webhook_id)
                return _finish(
                    conn, attempt.delivery_id, DeliveryStatus.FAILED, log, None, tries=tries
                )
            if tries >= rules.max_attempts:
                return _finish(
                    conn, attempt.delivery_id, DeliveryStatus.FAILED, log, None, tries=tries
                )
            conn.execute(
                update(deliveries)
                .where(deliveries.c.delivery_id == attempt.delivery_id)
                .values(
                    tries=tries,
                    attempts=codec.dumps(log),
                    claim=None,
                    next_at=time.time() + rules.delay_s(tries),
                    updated_at=utcnow(),
                )
            )
            return "retrying"

    def listing(self, webhook_id: str, limit: int = 50) -> list[Document]:
        """The hook's deliveries, newest first."""
        limit = whole_number(limit, "limit", low=1, high=MAX_PAGE)
        query = (
            select(deliveries)
            .where(deliveries.c.webhook_id == webhook_id)
            .order_by(deliveries.c.created_at.desc(), deliveries.c.delivery_id)
            .limit(limit)
        )
        with read_connection(self.engine) as conn:
            return [as_document(row._mapping) for row in conn.execute(query)]

    def redeliver(self, delivery_id: str, user_id: str | None = None) -> Document:
        """Send the delivery again now, with a fresh set of attempts and the same
        ``webhook-id`` (a copy already on its way may still arrive)."""
        with self.engine.begin() as conn:
            found = _owned(conn, delivery_id, user_id)
            if found is None:
                raise NotFoundError(f"unknown delivery {delivery_id!r}")
            if not found:
                raise RunStateError(
                    "the webhook is disabled (its receiver answered 410 Gone); add it again"
                )
            row = conn.execute(
                update(deliveries)
                .where(deliveries.c.delivery_id == delivery_id)
                .values(
                    status=DeliveryStatus.PENDING.value,
                    tries=0,
                    claim=None,
                    next_at=time.time(),
                    updated_at=utcnow(),
                )
                .returning(*deliveries.c)
            ).one()
        return as_document(row._mapping)


def _owned(conn: Connection, delivery_id: str, user_id: str | None) -> bool | None:
    """None if the delivery is unknown (or its hook not ``user_id``'s), else whether its
    hook is enabled."""
    query = (
        select(webhooks.c.enabled)
        .select_from(deliveries.join(webhooks, webhooks.c.webhook_id == deliveries.c.webhook_id))
        .where(deliveries.c.delivery_id == delivery_id)
    )
    if user_id is not None:
        query = query.where(webhooks.c.user_id == user_id)
    enabled = conn.execute(query).first()
    return None if enabled is None else bool(enabled[0])


def _pending() -> Any:
    return deliveries.c.status == DeliveryStatus.PENDING.value


def _hold(conn: Connection, delivery_id: str, claim: str, until: float) -> None:
    conn.execute(
        update(deliveries)
        .where(deliveries.c.delivery_id == delivery_id)
        .values(claim=claim, next_at=until)
    )


def _finish(
    conn: Connection,
    delivery_id: str,
    status: DeliveryStatus,
    log: list[Document],
    error: str | None,
    *,
    tries: int | None = None,
) -> str:
    values: dict[str, Any] = {"status": status.value, "claim": None, "updated_at": utcnow()}
    if log:
        values["attempts"] = codec.dumps(log)
    elif error:
        row = conn.execute(
            select(deliveries.c.attempts).where(deliveries.c.delivery_id == delivery_id)
        ).first()
        old = _loaded(row.attempts) if row is not None else []
        values["attempts"] = codec.dumps([*old, {"at": iso(utcnow()), "error": error}])
    if tries is not None:
        values["tries"] = tries
    conn.execute(update(deliveries).where(deliveries.c.delivery_id == delivery_id).values(values))
    return status.value


def _disable(conn: Connection, webhook_id: str) -> None:
    """The receiver said 410 Gone: the hook stops, and its pending deliveries with it."""
    conn.execute(
        update(webhooks)
        .where(webhooks.c.webhook_id == webhook_id)
        .values(enabled=false(), disabled_reason="the receiver answered 410 Gone")
    )
    conn.execute(
        update(deliveries)
        .where(deliveries.c.webhook_id == webhook_id, _pending())
        .values(status=DeliveryStatus.FAILED.value, claim=None, updated_at=utcnow())
    )


def _loaded(value: Any) -> list[Document]:
    return list(codec.loads(value) if isinstance(value, str) else value or [])


def as_document(row: Any) -> Document:
    """A delivery as ``webhook_deliveries()`` lists it; its id is its ``webhook-id``."""
    payload = row["payload"]
    return {
        "delivery_id": row["delivery_id"],
        "webhook_id": row["webhook_id"],
        "event": row["event"],
        "status": row["status"],
        "attempts": _loaded(row["attempts"]),
        "created_at": iso(row["created_at"]),
        "payload": codec.loads(payload) if isinstance(payload, str) else payload,
    }
