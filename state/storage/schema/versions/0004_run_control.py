"""Run control: idempotency keys for messages, spec fingerprints for workflows, step
timeouts and durable timers, and the indexes that page sessions and workflows.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_STEP_COLUMNS = ("timeout_s", "deadline_at", "not_before_s", "ready_at")
_INDEXES = (
    ("ix_sessions_created", "sessions", ["created_at", "session_id"]),
    ("ix_sessions_user_created", "sessions", ["user_id", "created_at", "session_id"]),
    ("ix_sessions_phase_created", "sessions", ["phase", "created_at", "session_id"]),
    ("ix_workflows_created", "workflows", ["created_at", "workflow_id"]),
    ("ix_workflows_session_created", "workflows", ["session_id", "created_at", "workflow_id"]),
    ("ix_workflows_status_created", "workflows", ["status", "created_at", "workflow_id"]),
)


def upgrade() -> None:
    op.add_column("inbox", sa.Column("idempotency_key", sa.String(255)))
    op.create_index("uq_inbox_session_key", "inbox", ["session_id", "idempotency_key"], unique=True)
    op.add_column("workflows", sa.Column("spec_hash", sa.String(64)))
    for column in _STEP_COLUMNS:
        op.add_column("workflow_steps", sa.Column(column, sa.Float()))
    for name, table, columns in _INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _columns in _INDEXES:
        op.drop_index(name, table_name=table)
    for column in _STEP_COLUMNS:
        with op.batch_alter_table("workflow_steps") as batch:
            batch.drop_column(column)
    with op.batch_alter_table("workflows") as batch:
        batch.drop_column("spec_hash")
    op.drop_index("uq_inbox_session_key", table_name="inbox")
    with op.batch_alter_table("inbox") as batch:
        batch.drop_column("idempotency_key")
