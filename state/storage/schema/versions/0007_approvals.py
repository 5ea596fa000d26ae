"""Human approval: the ``approvals`` table and a step's ``approval`` column.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_ID = sa.String(128)
_JSON = sa.Text().with_variant(JSONB(), "postgresql")
_AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("workflow_steps", sa.Column("approval", sa.String(16)))
    op.create_table(
        "approvals",
        sa.Column("approval_id", _ID, primary_key=True),
        sa.Column("session_id", _ID),
        sa.Column("user_id", _ID),
        sa.Column("workflow_id", _ID),
        sa.Column("step_id", _ID),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("args", _JSON, nullable=False),
        sa.Column("requested_at", _AT, nullable=False),
        sa.Column("expires_at", _AT, nullable=False),
        sa.Column("decision", sa.String(16)),
        sa.Column("decided_by", sa.String(128)),
        sa.Column("decided_at", _AT),
        sa.Column("note", sa.Text()),
    )
    op.create_index("ix_approvals_requested", "approvals", ["requested_at", "approval_id"])
    op.create_index(
        "ix_approvals_user_requested", "approvals", ["user_id", "requested_at", "approval_id"]
    )
    op.create_index("ix_approvals_decision_expires", "approvals", ["decision", "expires_at"])
    op.create_index("ix_approvals_workflow_step", "approvals", ["workflow_id", "step_id"])
    op.create_index("ix_approvals_session", "approvals", ["session_id"])


def downgrade() -> None:
    for name in (
        "ix_approvals_session",
        "ix_approvals_workflow_step",
        "ix_approvals_decision_expires",
        "ix_approvals_user_requested",
        "ix_approvals_requested",
    ):
        op.drop_index(name, table_name="approvals")
    op.drop_table("approvals")
    with op.batch_alter_table("workflow_steps") as batch:
        batch.drop_column("approval")
