"""Initial schema: user_state (adopted if it exists), sessions, messages, inbox,
workflows, workflow_steps, quarantine.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
ID = sa.String(128)
TS = sa.DateTime(timezone=True)
AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _adopt_or_create_user_state() -> None:
    # A deployment of the seed already has user_state(user_id, state, updated_at):
    # keep its rows and add our column with a default.
    inspector = sa.inspect(op.get_bind())
    if "user_state" not in inspector.get_table_names():
        op.create_table(
            "user_state",
            sa.Column("user_id", ID, primary_key=True),
            sa.Column("state", JSON, nullable=False),
            sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
            sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"),
        )
        return
    columns = {c["name"] for c in inspector.get_columns("user_state")}
    if "version" not in columns:
        op.add_column(
            "user_state",
            sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"),
        )


def upgrade() -> None:
    _adopt_or_create_user_state()
    _create_sessions()
    _create_messages_and_inbox()
    _create_workflows()
    _create_workflow_steps()
    _create_quarantine()


def _create_sessions() -> None:
    op.create_table(
        "sessions",
        sa.Column("session_id", ID, primary_key=True),
        sa.Column("user_id", ID, nullable=False, index=True),
        sa.Column("phase", sa.String(32), nullable=False, server_default="idle"),
        sa.Column("status", sa.String(16), nullable=False, server_default="active"),
        sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("doc", JSON, nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("inbox_seq", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("last_task_id", sa.String(255)),
        sa.Column("deadline_at", sa.Float()),
        sa.Column("recoveries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_sessions_phase_updated", "sessions", ["phase", "updated_at"])


def _create_messages_and_inbox() -> None:
    op.create_table(
        "messages",
        sa.Column("id", AUTO_ID, primary_key=True, autoincrement=True),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("timestamp", sa.String(64), nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),
    )
    op.create_table(
        "inbox",
        sa.Column("message_id", sa.String(64), primary_key=True),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, server_default="queued"),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("session_id", "seq", name="uq_inbox_session_seq"),
    )
    op.create_index("ix_inbox_state_created", "inbox", ["state", "created_at"])


def _create_workflows() -> None:
    op.create_table(
        "workflows",
        sa.Column("workflow_id", ID, primary_key=True),
        sa.Column("session_id", ID, index=True),
        sa.Column("status", sa.String(16), nullable=False, server_default="running"),
        sa.Column("context", JSON, nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("remaining_steps", sa.Integer(), nullable=False),
        sa.Column("failed_steps", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("resume_version", sa.BigInteger()),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS),
    )
    op.create_index("ix_workflows_status", "workflows", ["status"])


def _create_workflow_steps() -> None:
    op.create_table(
        "workflow_steps",
        sa.Column("workflow_id", ID, primary_key=True),
        sa.Column("step_id", ID, primary_key=True),
        sa.Column("step_name", sa.String(255), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("inputs", JSON, nullable=False),
        sa.Column("outputs", JSON, nullable=False),
        sa.Column("dependencies", JSON, nullable=False),
        sa.Column("dependents", JSON, nullable=False),
        sa.Column("remaining_deps", sa.Integer(), nullable=False),
        sa.Column("retry_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("recoveries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("error", sa.Text()),
        sa.Column("lease_expires_at", sa.Float()),
        sa.Column("started_at", TS),
        sa.Column("completed_at", TS),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_steps_status_updated", "workflow_steps", ["status", "updated_at"])


def _create_quarantine() -> None:
    op.create_table(
        "quarantine",
        sa.Column("id", AUTO_ID, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("quarantine", "workflow_steps", "workflows", "inbox", "messages", "sessions"):
        op.drop_table(table)
    op.drop_column("user_state", "version")
