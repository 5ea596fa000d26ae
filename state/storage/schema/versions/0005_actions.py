"""The actions each worker serves, published when it starts, so that a sender that has
not imported an app's action modules can still validate a workflow against them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "actions",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("module", sa.String(255), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("actions")
