"""Events and time travel: a session's event log (``events``, numbered per session by
``sessions.event_seq``) and a compact record of each committed revision (``revisions``).

Every existing session gets its current revision recorded in full, so that each later
revision has a base to apply its changes to.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_ID = sa.String(128)
_JSON = sa.Text().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column(
        "sessions", sa.Column("event_seq", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.create_table(
        "events",
        sa.Column("session_id", _ID, primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", _JSON, nullable=False),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_table(
        "revisions",
        sa.Column("session_id", _ID, primary_key=True),
        sa.Column("revision", sa.BigInteger(), primary_key=True),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("trigger", sa.String(255)),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message_count", sa.Integer(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("doc", _JSON),
        sa.Column("patch", sa.Text()),
    )
    op.create_index("ix_revisions_at", "revisions", ["at"])
    op.execute(
        "INSERT INTO revisions (session_id, revision, phase, status, trigger, at, "
        "message_count, event_seq, doc, patch) "
        "SELECT session_id, revision, phase, status, NULL, updated_at, message_count, 0, "
        "doc, NULL FROM sessions"
    )


def downgrade() -> None:
    op.drop_index("ix_revisions_at", table_name="revisions")
    op.drop_table("revisions")
    op.drop_index("ix_events_at", table_name="events")
    op.drop_table("events")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("event_seq")
