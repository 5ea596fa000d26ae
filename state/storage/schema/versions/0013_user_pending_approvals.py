"""A partial index of each user's undecided approvals (``ix_approvals_user_pending``).

Starting or retrying a workflow that asks for approvals counts the owner's undecided,
unexpired requests against AGENTSTATE_MAX_PENDING_APPROVALS, under the user's advisory
lock. ``ix_approvals_user_requested`` would make that count read every approval the user
ever had; the partial index holds only the undecided ones, by expiry.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_UNDECIDED = sa.text("decision IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_approvals_user_pending",
        "approvals",
        ["user_id", "expires_at"],
        postgresql_where=_UNDECIDED,
        sqlite_where=_UNDECIDED,
    )


def downgrade() -> None:
    op.drop_index("ix_approvals_user_pending", table_name="approvals")
