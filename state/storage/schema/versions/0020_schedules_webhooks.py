"""Schedules and webhooks: the tables, and the outbox triggers.

- ``schedules`` (one row per schedule: its cron or interval, its timezone, what a tick does,
  the next tick due) and ``schedule_runs`` (one row per tick, keyed by (schedule_id, tick):
  the guard that makes a tick fire once);
- ``webhooks`` and ``webhook_deliveries`` (the outbox: one row per event per hook, sent by
  workers, its attempts logged on it);
- triggers that write a delivery for every hook that wants it in the transaction of the
  change itself: a turn's reply (``turn.completed``, or ``turn.failed`` for an apology), an
  approval asked or decided, a workflow that ends ``success`` or ``failed``. Being in the
  database, they cover every path that writes those rows (the one-statement commits of the
  hot path included) and cost a reply's commit one look at the (small) hooks table; other
  events' rows do not call them at all (the ``WHEN`` condition).
  ``schedule.fired`` is written by the tick itself (``state.webhooks.outbox``).

Revision ID: 0020
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0015"
branch_labels = None
depends_on = None

ID = sa.String(128)


def _json() -> Any:
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.Text().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    _tables()
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRES_TRIGGERS:
            op.execute(statement)
    else:
        for statement in SQLITE_TRIGGERS:
            op.execute(statement)


def _tables() -> None:
    when: dict[str, Any] = {
        "postgresql_where": sa.text("paused = false"),
        "sqlite_where": sa.text("paused = false"),
    }
    op.create_table(
        "schedules",
        sa.Column("schedule_id", ID, primary_key=True),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("cron", sa.String(255)),
        sa.Column("every_seconds", sa.Float()),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("target_session_id", ID),
        sa.Column("text", sa.Text()),
        sa.Column("workflow", _json()),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("next_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedules_user", "schedules", ["user_id", "schedule_id"])
    op.create_index("ix_schedules_due", "schedules", ["next_tick"], **when)
    op.create_table(
        "schedule_runs",
        sa.Column("schedule_id", ID, primary_key=True),
        sa.Column("tick", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("message_id", sa.String(64)),
        sa.Column("run_workflow_id", ID),
        sa.Column("reason", sa.Text()),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedule_runs_fired", "schedule_runs", ["fired_at"])
    op.create_table(
        "webhooks",
        sa.Column("webhook_id", ID, primary_key=True),
        sa.Column("user_id", ID),
        sa.Column("session_id", ID),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("events", _json(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("disabled_reason", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_webhooks_user", "webhooks", ["user_id", "created_at"])
    pending: dict[str, Any] = {
        "postgresql_where": sa.text("status = 'pending'"),
        "sqlite_where": sa.text("status = 'pending'"),
    }
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.String(64), primary_key=True),
        sa.Column("webhook_id", ID, nullable=False),
        sa.Column("user_id", ID),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("tries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("claim", sa.String(64)),
        sa.Column("attempts", _json(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_deliveries_hook_created", "webhook_deliveries", ["webhook_id", "created_at"]
    )
    op.create_index("ix_deliveries_due", "webhook_deliveries", ["next_at"], **pending)
    op.create_index("ix_deliveries_created", "webhook_deliveries", ["created_at"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in POSTGRES_DROPS:
            op.execute(statement)
    else:
        for name in SQLITE_TRIGGER_NAMES:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for table in ("webhook_deliveries", "webhooks", "schedule_runs", "schedules"):
        op.drop_table(table)


# -- Postgres: one function writes the deliveries, one per source row calls it -------------

_POSTGRES_OUTBOX = """
CREATE FUNCTION agentstate_outbox(event text, owner text, session text, data jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  -- A user's hook hears that user's events, an operator's (no user) everyone's; a hook
  -- limited to a session hears only that session's.
  INSERT INTO webhook_deliveries (delivery_id, webhook_id, user_id, event, payload, status,
      tries, next_at, attempts, created_at, updated_at)
  SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), w.webhook_id, owner, event,
      jsonb_build_object('type', event,
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', data),
      'pending', 0, extract(epoch FROM clock_timestamp()), '[]'::jsonb, now(), now()
  FROM webhooks w
  WHERE w.enabled AND w.events ? event
    AND (w.user_id IS NULL OR w.user_id = owner)
    AND (w.session_id IS NULL OR w.session_id = session);
END $$"""

_POSTGRES_TURN = """
CREATE FUNCTION agentstate_outbox_turn() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE owner text;
BEGIN
  -- No hook at all (the usual case): one look at an empty table, nothing else.
  IF EXISTS (SELECT 1 FROM webhooks WHERE enabled) THEN
    SELECT user_id INTO owner FROM sessions WHERE session_id = NEW.session_id;
    PERFORM agentstate_outbox(
      CASE WHEN NEW.data->>'kind' = 'apology' THEN 'turn.failed' ELSE 'turn.completed' END,
      owner, NEW.session_id,
      jsonb_build_object('session_id', NEW.session_id, 'user_id', owner,
        'message_id', NEW.data->'message_id'));
  END IF;
  RETURN NULL;
END $$"""

_POSTGRES_APPROVAL = """
CREATE FUNCTION agentstate_outbox_approval() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE data jsonb;
BEGIN
  data := jsonb_build_object('approval_id', NEW.approval_id, 'user_id', NEW.user_id,
    'session_id', NEW.session_id, 'workflow_id', NEW.workflow_id, 'step_id', NEW.step_id,
    'action', NEW.action);
  IF TG_OP = 'INSERT' THEN
    PERFORM agentstate_outbox('approval.requested', NEW.user_id, NEW.session_id, data);
  ELSE
    PERFORM agentstate_outbox('approval.decided', NEW.user_id, NEW.session_id,
      data || jsonb_build_object('approve', NEW.decision = 'approved', 'by', NEW.decided_by));
  END IF;
  RETURN NULL;
END $$"""

_POSTGRES_WORKFLOW = """
CREATE FUNCTION agentstate_outbox_workflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM agentstate_outbox(
    CASE WHEN NEW.status = 'success' THEN 'workflow.completed' ELSE 'workflow.failed' END,
    NEW.user_id, NEW.session_id,
    jsonb_build_object('workflow_id', NEW.workflow_id, 'session_id', NEW.session_id,
      'user_id', NEW.user_id, 'status', NEW.status));
  RETURN NULL;
END $$"""

POSTGRES_TRIGGERS = (
    _POSTGRES_OUTBOX,
    _POSTGRES_TURN,
    _POSTGRES_APPROVAL,
    _POSTGRES_WORKFLOW,
    "CREATE TRIGGER agentstate_outbox_turn AFTER INSERT ON events FOR EACH ROW "
    "WHEN (NEW.kind = 'reply' AND (NEW.data->>'kind') IS DISTINCT FROM 'cancelled') "
    "EXECUTE FUNCTION agentstate_outbox_turn()",
    "CREATE TRIGGER agentstate_outbox_approval_requested AFTER INSERT ON approvals "
    "FOR EACH ROW EXECUTE FUNCTION agentstate_outbox_approval()",
    "CREATE TRIGGER agentstate_outbox_approval_decided AFTER UPDATE OF decision ON approvals "
    "FOR EACH ROW WHEN (OLD.decision IS NULL AND NEW.decision IS NOT NULL) "
    "EXECUTE FUNCTION agentstate_outbox_approval()",
    "CREATE TRIGGER agentstate_outbox_workflow AFTER UPDATE OF status ON workflows "
    "FOR EACH ROW WHEN (NEW.status IN ('success', 'failed') "
    "AND OLD.status IS DISTINCT FROM NEW.status) "
    "EXECUTE FUNCTION agentstate_outbox_workflow()",
)

POSTGRES_DROPS = (
    "DROP TRIGGER IF EXISTS agentstate_outbox_turn ON events",
    "DROP TRIGGER IF EXISTS agentstate_outbox_approval_requested ON approvals",
    "DROP TRIGGER IF EXISTS agentstate_outbox_approval_decided ON approvals",
    "DROP TRIGGER IF EXISTS agentstate_outbox_workflow ON workflows",
    "DROP FUNCTION IF EXISTS agentstate_outbox_turn()",
    "DROP FUNCTION IF EXISTS agentstate_outbox_approval()",
    "DROP FUNCTION IF EXISTS agentstate_outbox_workflow()",
    "DROP FUNCTION IF EXISTS agentstate_outbox(text, text, text, jsonb)",
)


# -- SQLite: the same, one trigger each (SQLite has no functions to share) --------------


def _sqlite_insert(event: str, owner: str, session: str, data: str) -> str:
    """The INSERT ... SELECT of a SQLite trigger: ``event``, ``owner``, ``session`` and
    ``data`` are SQL expressions over ``NEW``."""
    now = "strftime('%Y-%m-%d %H:%M:%S', 'now') || '.000000'"
    return f"""
  INSERT INTO webhook_deliveries (delivery_id, webhook_id, user_id, event, payload, status,
      tries, next_at, attempts, created_at, updated_at)
  SELECT 'msg_' || lower(hex(randomblob(16))), w.webhook_id, {owner}, {event},
      json_object('type', {event}, 'timestamp', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        'data', json({data})),
      'pending', 0, (julianday('now') - 2440587.5) * 86400.0, '[]', {now}, {now}
  FROM webhooks w
  WHERE w.enabled AND EXISTS (SELECT 1 FROM json_each(w.events) WHERE value = {event})
    AND (w.user_id IS NULL OR w.user_id = {owner})
    AND (w.session_id IS NULL OR w.session_id = {session});"""  # noqa: S608 - fixed SQL


_TURN_EVENT = (
    "(CASE WHEN json_extract(NEW.data, '$.kind') = 'apology' "
    "THEN 'turn.failed' ELSE 'turn.completed' END)"
)
_OWNER = "(SELECT user_id FROM sessions WHERE session_id = NEW.session_id)"
_APPROVAL = (
    "json_object('approval_id', NEW.approval_id, 'user_id', NEW.user_id, "
    "'session_id', NEW.session_id, 'workflow_id', NEW.workflow_id, 'step_id', NEW.step_id, "
    "'action', NEW.action"
)

SQLITE_TRIGGER_NAMES = (
    "agentstate_outbox_turn",
    "agentstate_outbox_approval_requested",
    "agentstate_outbox_approval_decided",
    "agentstate_outbox_workflow",
)

SQLITE_TRIGGERS = (
    "CREATE TRIGGER agentstate_outbox_turn AFTER INSERT ON events "
    "WHEN NEW.kind = 'reply' AND coalesce(json_extract(NEW.data, '$.kind'), '') <> 'cancelled' "
    "BEGIN"
    + _sqlite_insert(
        _TURN_EVENT,
        _OWNER,
        "NEW.session_id",
        "json_object('session_id', NEW.session_id, 'user_id', "
        f"{_OWNER}, 'message_id', json_extract(NEW.data, '$.message_id'))",
    )
    + " END",
    "CREATE TRIGGER agentstate_outbox_approval_requested AFTER INSERT ON approvals BEGIN"
    + _sqlite_insert("'approval.requested'", "NEW.user_id", "NEW.session_id", _APPROVAL + ")")
    + " END",
    "CREATE TRIGGER agentstate_outbox_approval_decided AFTER UPDATE OF decision ON approvals "
    "WHEN OLD.decision IS NULL AND NEW.decision IS NOT NULL BEGIN"
    + _sqlite_insert(
        "'approval.decided'",
        "NEW.user_id",
        "NEW.session_id",
        _APPROVAL + ", 'approve', json(CASE WHEN NEW.decision = 'approved' "
        "THEN 'true' ELSE 'false' END), 'by', NEW.decided_by)",
    )
    + " END",
    "CREATE TRIGGER agentstate_outbox_workflow AFTER UPDATE OF status ON workflows "
    "WHEN NEW.status IN ('success', 'failed') AND OLD.status IS NOT NEW.status BEGIN"
    + _sqlite_insert(
        "(CASE WHEN NEW.status = 'success' THEN 'workflow.completed' ELSE 'workflow.failed' END)",
        "NEW.user_id",
        "NEW.session_id",
        "json_object('workflow_id', NEW.workflow_id, 'session_id', NEW.session_id, "
        "'user_id', NEW.user_id, 'status', NEW.status)",
    )
    + " END",
)
