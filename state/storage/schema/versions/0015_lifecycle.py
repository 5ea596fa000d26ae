"""The data lifecycle: indexes retention reads, and forks that share their source's
history instead of copying it.

- ``ix_workflows_finished`` (finished_at): retention finds workflows finished long ago
  without scanning every workflow; ``ix_approvals_decided`` (decided_at) likewise for
  decided approvals.
- ``sessions.prefix_session_id`` / ``prefix_count``: a fork's history is the first
  ``prefix_count`` messages of ``prefix_session_id`` followed by its own rows (whose seq
  start at ``prefix_count``); ``ix_sessions_prefix`` finds the forks of a session that is
  being deleted, so they are kept readable first.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workflows_finished", "workflows", ["finished_at"])
    op.create_index("ix_approvals_decided", "approvals", ["decided_at"])
    op.add_column("sessions", sa.Column("prefix_session_id", sa.String(128), nullable=True))
    op.add_column(
        "sessions", sa.Column("prefix_count", sa.Integer(), nullable=False, server_default="0")
    )
    op.create_index("ix_sessions_prefix", "sessions", ["prefix_session_id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_prefix", table_name="sessions")
    op.drop_column("sessions", "prefix_count")
    op.drop_column("sessions", "prefix_session_id")
    op.drop_index("ix_approvals_decided", table_name="approvals")
    op.drop_index("ix_workflows_finished", table_name="workflows")
