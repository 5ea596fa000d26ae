"""Workflow steps remember the task that last changed them, so a redelivery of that task
(after its commit acknowledgement was lost) can finish what the commit set in motion.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workflow_steps", sa.Column("last_task_id", sa.String(255)))


def downgrade() -> None:
    op.drop_column("workflow_steps", "last_task_id")
