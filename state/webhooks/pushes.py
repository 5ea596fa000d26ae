"""A2A push notification configs: webhooks limited to one task (the turn's message id).

A config is a row of ``webhooks`` with its ``a2a_*`` columns set, so its deliveries are
the outbox's like any hook's: written by the triggers in the transaction of the task's
change (its reply, an approval asked or decided), signed, retried, given up alike. What
differs is only at send time (``a2a_body``): the body is the A2A ``StreamResponse`` a
receiver of that protocol expects (a ``statusUpdate`` of the task), and the config's token
and ``Authorization`` go along as headers.

The signing secret: an ``authentication`` with the scheme ``whsec`` gives it (its
credentials, a ``whsec_...`` secret, the receiver verifies with); any other scheme is sent
as ``Authorization: <scheme> <credentials>`` and the body signed with a fresh secret.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select, update

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import WebhookSpecError
from state.ids import new_id, validate_id
from state.quota import reserve_one
from state.storage.db import read_connection
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks.hooks import QUOTA_SETTING, checked_secret, new_secret
from state.webhooks.outbox import WebhookEvent
from state.webhooks.urls import resolve

SIGNING_SCHEME = "whsec"
MAX_TOKEN = 4096
# What a task's config hears, and the A2A state each event puts the task in.
STATES = {
    WebhookEvent.TURN_COMPLETED.value: "TASK_STATE_COMPLETED",
    WebhookEvent.TURN_FAILED.value: "TASK_STATE_FAILED",
    WebhookEvent.APPROVAL_REQUESTED.value: "TASK_STATE_INPUT_REQUIRED",
    WebhookEvent.APPROVAL_DECIDED.value: "TASK_STATE_WORKING",
}


@dataclass(frozen=True)
class PushConfig:
    """One config as the A2A door shows it (never the signing secret nor the
    credentials)."""

    task_id: str
    config_id: str
    url: str
    token: str
    scheme: str


def _as_config(row: object) -> PushConfig:
    auth = codec.loads(row.a2a_auth) if row.a2a_auth else {}  # type: ignore[attr-defined]
    return PushConfig(
        task_id=row.a2a_task,  # type: ignore[attr-defined]
        config_id=row.a2a_config,  # type: ignore[attr-defined]
        url=row.url,  # type: ignore[attr-defined]
        token=row.a2a_token or "",  # type: ignore[attr-defined]
        scheme=str(auth.get("scheme", "")),
    )


class PushStore:
    """The A2A push configs of tasks (see the module docstring). The caller checks that the
    task is the caller's: here a task id is trusted."""

    def __init__(self, engine: Engine, max_per_user: int | None = None) -> None:
        self.engine = engine
        self.max_per_user = max_per_user

    def put(
        self,
        task: Document,
        url: str,
        *,
        config_id: str = "",
        token: str = "",
        scheme: str = "",
        credentials: str = "",
        allow_private: bool = False,
    ) -> PushConfig:
        """Set the config ``config_id`` (a fresh id if empty) of ``task`` (its message
        row: ``message_id``, ``session_id``, ``user_id``); the same id again replaces it."""
        config_id = (
            validate_id(config_id, "push notification config") if config_id else (uuid.uuid4().hex)
        )
        if len(token) > MAX_TOKEN:
            raise WebhookSpecError(f"a push notification token is at most {MAX_TOKEN} characters")
        target = resolve(url, allow_private)
        secret = new_secret()
        auth: Document = {}
        if scheme.lower() == SIGNING_SCHEME:
            secret = checked_secret(credentials)
            auth = {"scheme": SIGNING_SCHEME}
        elif scheme:
            if not credentials:
                raise WebhookSpecError(f"authentication scheme {scheme!r} needs credentials")
            auth = {"scheme": scheme, "credentials": credentials}
        values = {
            "user_id": task["user_id"],
            "session_id": task["session_id"],
            "url": target.url,
            "secret": secret,
            "events": codec.dumps(list(STATES)),
            "enabled": True,
            "disabled_reason": None,
            "a2a_token": token or None,
            "a2a_auth": codec.dumps(auth) if auth else None,
        }
        task_id = str(task["message_id"])
        mine = (webhooks.c.a2a_task == task_id, webhooks.c.a2a_config == config_id)
        with self.engine.begin() as conn:
            had = conn.execute(select(webhooks.c.webhook_id).where(*mine).with_for_update()).first()
            if had is not None:
                conn.execute(update(webhooks).where(*mine).values(values))
            else:
                user = task["user_id"]
                if user is not None and self.max_per_user is not None:
                    reserve_one(conn, webhooks, user, self.max_per_user, QUOTA_SETTING)
                conn.execute(
                    insert(webhooks).values(
                        webhook_id=new_id("a2a"),
                        a2a_task=task_id,
                        a2a_config=config_id,
                        created_at=utcnow(),
                        **values,
                    )
                )
        return PushConfig(task_id, config_id, target.url, token, str(auth.get("scheme", "")))

    def get(self, task_id: str, config_id: str) -> PushConfig | None:
        """The config, or None."""
        query = select(webhooks).where(
            webhooks.c.a2a_task == task_id, webhooks.c.a2a_config == config_id
        )
        with read_connection(self.engine) as conn:
            row = conn.execute(query).first()
        return None if row is None else _as_config(row)

    def listing(self, task_id: str, after: str = "", limit: int = 100) -> list[PushConfig]:
        """The task's configs in id order, from after ``after``; at most ``limit``."""
        query = (
            select(webhooks)
            .where(webhooks.c.a2a_task == task_id, webhooks.c.a2a_config > after)
            .order_by(webhooks.c.a2a_config)
            .limit(limit)
        )
        with read_connection(self.engine) as conn:
            return [_as_config(row) for row in conn.execute(query)]

    def remove(self, task_id: str, config_id: str) -> bool:
        """Delete the config and its deliveries; False if there was none."""
        mine = (webhooks.c.a2a_task == task_id, webhooks.c.a2a_config == config_id)
        with self.engine.begin() as conn:
            found = conn.execute(select(webhooks.c.webhook_id).where(*mine)).first()
            if found is None:
                return False
            conn.execute(delete(webhooks).where(*mine))
            conn.execute(delete(deliveries).where(deliveries.c.webhook_id == found[0]))
        return True


def a2a_body(payload: Document, task_id: str) -> Document:
    """The A2A ``StreamResponse`` a delivery's stored body stands for: a ``statusUpdate``
    of the task, its state from the event, its time the event's."""
    data = payload.get("data") or {}
    state = STATES.get(str(payload.get("type")), "TASK_STATE_WORKING")
    return {
        "statusUpdate": {
            "taskId": task_id,
            "contextId": data.get("session_id") or "",
            "status": {"state": state, "timestamp": payload.get("timestamp")},
            "metadata": {"event": payload.get("type")},
        }
    }


def a2a_headers(token: str | None, auth: str | None) -> dict[str, str]:
    """The headers a config asks for besides the signature's."""
    headers: dict[str, str] = {}
    if token:
        headers["X-A2A-Notification-Token"] = token
    found = codec.loads(auth) if auth else {}
    if found.get("credentials"):
        headers["Authorization"] = f"{found['scheme']} {found['credentials']}"
    return headers
