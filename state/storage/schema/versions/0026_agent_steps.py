"""Recorded steps of framework agents' runs (Pydantic AI): ``agent_steps``, one row per
model request or tool call of a turn's run, kept and erased with its session.

Revision ID: 0026
Revises: 0024
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0024"
branch_labels = None
depends_on = None

ID = sa.String(128)


def upgrade() -> None:
    op.create_table(
        "agent_steps",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("message_id", ID, nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "message_id", "run", "name", "n"),
    )


def downgrade() -> None:
    op.drop_table("agent_steps")
