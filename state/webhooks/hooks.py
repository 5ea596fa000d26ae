"""Registered webhooks: add (URL checked, secret made or checked), list, remove. A user's
hook hears only that user's events; a hook of nobody (an operator's) hears everyone's."""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from state.clock import iso, utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import NotFoundError, WebhookSpecError
from state.ids import new_id, validate_id
from state.quota import reserve_one
from state.storage.db import read_connection
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks.outbox import WebhookEvent
from state.webhooks.urls import resolve

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
# The Standard Webhooks specification's range for a symmetric signing key.
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64
QUOTA_SETTING = "AGENTSTATE_MAX_WEBHOOKS_PER_USER"


def unknown(webhook_id: str) -> NotFoundError:
    """What another user's hook, or one that does not exist, raises."""
    return NotFoundError(f"unknown webhook {webhook_id!r}")


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_...`` secret stands for."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def checked_secret(secret: object) -> str:
    """``secret`` if it is ``whsec_`` and the base64 of 24 to 64 bytes."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise WebhookSpecError(
            f"a webhook secret is {SECRET_PREFIX!r} and base64 (leave it out to get one)"
        )
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSpecError("a webhook secret must be whsec_ and valid base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise WebhookSpecError(
            f"a webhook secret's key must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, "
            f"got {len(key)}"
        )
    return secret


def checked_events(events: object) -> list[str]:
    """``events`` as a list of known event names, each once, in the order given."""
    if isinstance(events, str) or not isinstance(events, list | tuple) or not events:
        raise WebhookSpecError("events must be a non-empty list of event names")
    known = {e.value for e in WebhookEvent}
    names: list[str] = []
    for event in events:
        if event not in known:
            raise WebhookSpecError(
                f"unknown event {event!r}; events are: {', '.join(sorted(known))}"
            )
        if event not in names:
            names.append(str(event))
    return names


class HookStore:
    """The ``webhooks`` table (see the module docstring)."""

    def __init__(self, engine: Engine, max_per_user: int | None = None) -> None:
        self.engine = engine
        self.max_per_user = max_per_user

    def add(
        self,
        url: object,
        events: object,
        *,
        user_id: str | None = None,
        secret: str | None = None,
        session_id: str | None = None,
        allow_private: bool = False,
    ) -> Document:
        """Register a hook; returns it with its ``webhook_id`` and ``secret`` (the only
        time the secret is shown)."""
        if user_id is not None:
            validate_id(user_id, "user")
        if session_id is not None:
            validate_id(session_id, "session")
        names = checked_events(events)
        target = resolve(url, allow_private)  # type: ignore[arg-type] # checked inside
        now = utcnow()
        values = {
            "webhook_id": new_id("wh"),
            "user_id": user_id,
            "session_id": session_id,
            "url": target.url,
            "secret": new_secret() if secret is None else checked_secret(secret),
            "events": codec.dumps(names),
            "enabled": True,
            "disabled_reason": None,
            "created_at": now,
        }
        with self.engine.begin() as conn:
            if user_id is not None and self.max_per_user is not None:
                reserve_one(conn, webhooks, user_id, self.max_per_user, QUOTA_SETTING)
            conn.execute(insert(webhooks).values(values))
        return {**as_document(values), "secret": values["secret"]}

    def get(self, webhook_id: str, user_id: str | None = None) -> Document | None:
        """The hook (without its secret), or None (unknown, or not ``user_id``'s)."""
        query = select(webhooks).where(webhooks.c.webhook_id == webhook_id, _plain())
        if user_id is not None:
            query = query.where(webhooks.c.user_id == user_id)
        with read_connection(self.engine) as conn:
            row = conn.execute(query).first()
        return None if row is None else as_document(row._mapping)

    def listing(self, user_id: str | None = None) -> list[Document]:
        """Every hook (of ``user_id``, if given), oldest first, without secrets."""
        query = (
            select(webhooks).where(_plain()).order_by(webhooks.c.created_at, webhooks.c.webhook_id)
        )
        if user_id is not None:
            query = query.where(webhooks.c.user_id == user_id)
        with read_connection(self.engine) as conn:
            return [as_document(row._mapping) for row in conn.execute(query)]

    def remove(self, webhook_id: str, user_id: str | None = None) -> bool:
        """Delete the hook and its deliveries (NotFoundError if there is none)."""
        statement = delete(webhooks).where(webhooks.c.webhook_id == webhook_id, _plain())
        if user_id is not None:
            statement = statement.where(webhooks.c.user_id == user_id)
        with self.engine.begin() as conn:
            if not conn.execute(statement).rowcount:
                raise unknown(webhook_id)
            conn.execute(delete(deliveries).where(deliveries.c.webhook_id == webhook_id))
        return True


def _plain() -> Any:
    """Not an A2A push notification config (those are the A2A door's, see ``pushes``)."""
    return webhooks.c.a2a_task.is_(None)


def as_document(row: Any) -> Document:
    """A ``webhooks`` row as the client lists it (never its secret)."""
    events = row["events"]
    return {
        "webhook_id": row["webhook_id"],
        "url": row["url"],
        "events": codec.loads(events) if isinstance(events, str) else events,
        "user_id": row["user_id"],
        "session_id": row["session_id"],
        "enabled": bool(row["enabled"]),
        "disabled_reason": row["disabled_reason"],
        "created_at": iso(row["created_at"]),
    }
