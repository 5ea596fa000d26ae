"""One word per idea: the row fence is ``revision`` in every table (``_version`` stays the
schema version inside a stored document).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_RENAMES = (
    ("user_state", "version", "revision"),
    ("sessions", "version", "revision"),
    ("workflow_steps", "version", "revision"),
    ("workflows", "resume_version", "resume_revision"),
)


def upgrade() -> None:
    for table, old, new in _RENAMES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(old, new_column_name=new)


def downgrade() -> None:
    for table, old, new in _RENAMES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(new, new_column_name=old)
