"""Many agents on one deployment: a session's agent, and LangGraph checkpoints.

- ``sessions.agent``: the name (from AGENTSTATE_AGENTS) of the agent a session's first
  message chose; NULL is the default agent (AGENTSTATE_AGENT), so every row written before
  this migration, and every session of a deployment with one agent, keeps its meaning
  without being rewritten.
- ``lg_checkpoints`` and ``lg_writes``: the checkpoints of LangGraph graphs that run as
  agents (``tasks.integrations.langgraph``), one thread per session, kept and erased with
  it. ``message_id`` names the turn that wrote a checkpoint, so a turn whose worker died
  resumes its own run and a new turn never resumes an old one.

Revision ID: 0024
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0020"
branch_labels = None
depends_on = None

ID = sa.String(128)


def upgrade() -> None:
    op.add_column("sessions", sa.Column("agent", sa.String(64), nullable=True))
    op.create_table(
        "lg_checkpoints",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.String(255), nullable=False, server_default=""),
        sa.Column("checkpoint_id", sa.String(64), nullable=False),
        sa.Column("parent_checkpoint_id", sa.String(64), nullable=True),
        sa.Column("message_id", ID, nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "checkpoint_ns", "checkpoint_id"),
    )
    op.create_table(
        "lg_writes",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.String(255), nullable=False, server_default=""),
        sa.Column("checkpoint_id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("task_path", sa.String(255), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("session_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
    )


def downgrade() -> None:
    op.drop_table("lg_writes")
    op.drop_table("lg_checkpoints")
    op.drop_column("sessions", "agent")
