"""Drop three indexes that a wider index already serves (each a write on every insert,
and for ``ix_sessions_user_id`` on every phase's commit, which is never a HOT update).

- ``ix_sessions_user_id``: ``ix_sessions_user_created`` starts with ``user_id``;
- ``ix_workflows_session_id``: ``ix_workflows_session_created`` starts with ``session_id``;
- ``ix_workflows_status``: ``ix_workflows_status_created`` starts with ``status``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# (index, table, columns): what downgrade creates again.
_DROPPED = (
    ("ix_sessions_user_id", "sessions", ["user_id"]),
    ("ix_workflows_session_id", "workflows", ["session_id"]),
    ("ix_workflows_status", "workflows", ["status"]),
)


def upgrade() -> None:
    for name, table, _ in _DROPPED:
        op.drop_index(name, table_name=table)


def downgrade() -> None:
    for name, table, columns in _DROPPED:
        op.create_index(name, table, columns)
