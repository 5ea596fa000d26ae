"""Drop ``ix_inbox_state_created``: every reader of queued messages goes by the partial
``ix_inbox_session_queued`` (0010), and nothing reads other states by time.

With it, a turn's reads of its own session's queued messages could be planned on it:
after an ANALYZE that saw almost nothing queued (the usual case: messages wait for
moments, and are kept answered), the planner judged "every queued message in the
database, by time" cheaper than the session's, a read that grows with the backlog of all
sessions. The sweep's "resting session with a message waiting since before the cutoff"
reads the partial index too. Dropping it also saves an index write on each message's
accept, start and answer.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_inbox_state_created", table_name="inbox")


def downgrade() -> None:
    op.create_index("ix_inbox_state_created", "inbox", ["state", "created_at"])
