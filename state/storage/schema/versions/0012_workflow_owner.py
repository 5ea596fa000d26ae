"""Workflows get an owner (``workflows.user_id``): their session's user, or the user who
started them when they have no session.

Until now a workflow's user was read through its session, so a workflow of no session
belonged to nobody: anyone could read it, cancel it or list it. The owner is written
when the workflow is created (in the creating transaction) and never changes; listing a
user's workflows, newest first, reads ``ix_workflows_user_created``. Existing workflows
take their session's user; those of no session keep none (operator-only from now on).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workflows", sa.Column("user_id", sa.String(128), nullable=True))
    op.execute(
        "UPDATE workflows SET user_id = "
        "(SELECT s.user_id FROM sessions s WHERE s.session_id = workflows.session_id) "
        "WHERE session_id IS NOT NULL"
    )
    op.create_index(
        "ix_workflows_user_created", "workflows", ["user_id", "created_at", "workflow_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_workflows_user_created", table_name="workflows")
    op.drop_column("workflows", "user_id")
