"""Sending the outbox: find what is due, and send one delivery under its claim."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from config import Settings
from state.webhooks import sender
from state.webhooks.deliveries import DeliveryStore, RetryRules
from state.webhooks.sender import SendRules

# A claim outlives its attempt's time limit this many times over, plus a margin for the way
# from claim to send (a queue, a worker's start).
LEASE_ATTEMPTS = 3
LEASE_MARGIN_S = 5.0


@dataclass(frozen=True)
class Courier:
    """The outbox's sender (``state.webhooks.deliveries`` says how claims work)."""

    store: DeliveryStore
    retry: RetryRules
    send: SendRules

    @classmethod
    def build(cls, engine: Engine, settings: Settings) -> Courier:
        """A courier with the AGENTSTATE_WEBHOOK_* settings."""
        return cls(
            DeliveryStore(engine),
            RetryRules(settings.webhook_max_attempts, settings.webhook_retry_base_seconds),
            SendRules(settings.webhook_timeout, settings.webhook_allow_private),
        )

    @property
    def lease_s(self) -> float:
        """How long a claim holds a delivery before it is due again (a sender killed
        mid-send loses it to the next look after this)."""
        return LEASE_ATTEMPTS * self.send.timeout_s + LEASE_MARGIN_S

    def due(self, limit: int = 100) -> list[tuple[str, str]]:
        """Claim up to ``limit`` due deliveries: (delivery_id, claim) to hand to senders."""
        return self.store.claim_due(self.lease_s, limit)

    def deliver(self, delivery_id: str, claim: str) -> str:
        """One attempt of the delivery if ``claim`` still holds it; what became of it
        (``delivered``, ``retrying``, ``failed``, or ``stale``: not ours)."""
        attempt = self.store.start(delivery_id, claim, self.lease_s)
        if attempt is None:
            return "stale"
        outcome = sender.attempt(attempt, self.send)
        return self.store.record(attempt, outcome, self.retry)
