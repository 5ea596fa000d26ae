"""Fair share and overload: a step knows its owner, and a ready step beyond its owner's
AGENTSTATE_USER_STEP_CONCURRENCY waits in the database (``waiting_since``) until one of
that owner's running steps finishes; the sweep's re-sends back off (``resent_revision``,
``resends``, ``resend_at`` on sessions and steps) so that merely queued work is neither
given up nor multiplied.

A workflow's quick roots beyond its owner's window are ``held`` at its start (parked
too), and each finished step of the owner hands one over, so that thousands of quick
steps do not flood the steps' queue ahead of everyone else's.

``ix_steps_owner_running`` counts an owner's running steps (a claim's check);
``ix_steps_owner_waiting`` finds an owner's waiting steps, oldest first. Existing steps
take their workflow's owner ("" for none).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_RUNNING = sa.text("status = 'running'")
_WAITING = sa.text("waiting_since IS NOT NULL")


def _resend_columns(table: str) -> None:
    op.add_column(table, sa.Column("resent_revision", sa.BigInteger(), nullable=True))
    op.add_column(table, sa.Column("resends", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(table, sa.Column("resend_at", sa.Float(), nullable=True))


def upgrade() -> None:
    op.add_column(
        "workflow_steps", sa.Column("owner", sa.String(128), nullable=False, server_default="")
    )
    op.add_column("workflow_steps", sa.Column("waiting_since", sa.Float(), nullable=True))
    op.add_column(
        "workflow_steps",
        sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    _resend_columns("workflow_steps")
    _resend_columns("sessions")
    op.execute(
        "UPDATE workflow_steps SET owner = coalesce((SELECT w.user_id FROM workflows w "
        "WHERE w.workflow_id = workflow_steps.workflow_id), '')"
    )
    op.create_index(
        "ix_steps_owner_running",
        "workflow_steps",
        ["owner"],
        postgresql_where=_RUNNING,
        sqlite_where=_RUNNING,
    )
    op.create_index(
        "ix_steps_owner_waiting",
        "workflow_steps",
        ["owner", "waiting_since"],
        postgresql_where=_WAITING,
        sqlite_where=_WAITING,
    )


def downgrade() -> None:
    op.drop_index("ix_steps_owner_waiting", table_name="workflow_steps")
    op.drop_index("ix_steps_owner_running", table_name="workflow_steps")
    for table in ("sessions", "workflow_steps"):
        for column in ("resend_at", "resends", "resent_revision"):
            op.drop_column(table, column)
    op.drop_column("workflow_steps", "held")
    op.drop_column("workflow_steps", "waiting_since")
    op.drop_column("workflow_steps", "owner")
