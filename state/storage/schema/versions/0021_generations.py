"""Generations: sessions, workflows and their steps carry the generation minted when the
row was created (``state.storage.generations``), so whatever a process keeps about a row
is bound to that row and not to an id that erasure or retention may free for someone else.

- Postgres: the sequence ``agentstate_generation``; ``sessions.generation`` and
  ``workflows.generation`` default to its next value (existing rows get one each);
  ``workflow_steps.generation`` is copied from the step's workflow.
- SQLite: the columns, filled with random 63-bit numbers (it has no sequences).
- ``inbox.user_id`` (the session's user, filled in) and ``ix_inbox_user_queued`` on it for
  the queued rows: AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER counts a user's waiting
  messages in one short index scan.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

SEQUENCE = "agentstate_generation"
_COPY_STEPS = """UPDATE workflow_steps SET generation = (
  SELECT w.generation FROM workflows w WHERE w.workflow_id = workflow_steps.workflow_id)"""


def upgrade() -> None:
    _inbox_users()
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
        minted = sa.text(f"nextval('{SEQUENCE}')")
        for table in ("sessions", "workflows"):
            op.add_column(
                table,
                sa.Column("generation", sa.BigInteger(), nullable=False, server_default=minted),
            )
        op.add_column(
            "workflow_steps",
            sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0"),
        )
        op.execute(_COPY_STEPS)
        op.alter_column("workflow_steps", "generation", server_default=None)
        return
    for table in ("sessions", "workflows", "workflow_steps"):
        op.add_column(
            table, sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.execute("UPDATE sessions SET generation = abs(random())")
    op.execute("UPDATE workflows SET generation = abs(random())")
    op.execute(_COPY_STEPS)


def _inbox_users() -> None:
    op.add_column("inbox", sa.Column("user_id", sa.String(128), nullable=True))
    op.execute(
        "UPDATE inbox SET user_id = (SELECT s.user_id FROM sessions s "
        "WHERE s.session_id = inbox.session_id)"
    )
    queued = sa.text("state = 'queued'")
    op.create_index(
        "ix_inbox_user_queued",
        "inbox",
        ["user_id"],
        postgresql_where=queued,
        sqlite_where=queued,
    )


def downgrade() -> None:
    op.drop_index("ix_inbox_user_queued", table_name="inbox")
    op.drop_column("inbox", "user_id")
    for table in ("workflow_steps", "workflows", "sessions"):
        op.drop_column(table, "generation")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
