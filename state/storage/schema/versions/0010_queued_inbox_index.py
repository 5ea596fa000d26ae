"""A partial index of each session's queued messages, in order (``ix_inbox_session_queued``).

A turn reads its session's next queued message, and a turn's last commit asks whether
one is queued. Both looked through every inbox row the session ever had (by
``uq_inbox_session_seq`` or ``uq_inbox_session_key``) to find the few still queued: a
cost that grew with the session's age. The partial index holds only queued rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    op.create_index(
        "ix_inbox_session_queued",
        "inbox",
        ["session_id", "seq"],
        postgresql_where=_QUEUED,
        sqlite_where=_QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_inbox_session_queued", table_name="inbox")
