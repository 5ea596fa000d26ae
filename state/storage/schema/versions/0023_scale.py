"""Maintenance that costs what it does, not what the database holds (issue #47).

- ``revisions.is_floor`` and the partial index ``ix_revisions_unfloored`` (the
  checkpoints retention has not yet pruned below): a prune reads only the checkpoints
  that aged past the cutoff since the last run, never the records it keeps.
- ``ix_steps_unattended``: the recovery sweep's look for ready steps with no live task
  reads the pending and retrying steps that wait for no approval and are not parked for
  their owner's fair share (those owe no worker anything), not every one of them. Its
  predicate names no column a dependent's countdown writes, so that update stays HOT
  (migration 0008); finished steps are not in it.

Checkpoints recorded before this migration are no floor: the first prune after it reads
each old one once.

Revision ID: 0023
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0021"
branch_labels = None
depends_on = None

_UNFLOORED = sa.text("doc IS NOT NULL AND is_floor = false")
_UNATTENDED = sa.text(
    "status IN ('pending', 'retrying') AND waiting_since IS NULL "
    "AND (approval IS NULL OR approval <> 'pending')"
)


def upgrade() -> None:
    op.add_column(
        "revisions",
        sa.Column("is_floor", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "ix_revisions_unfloored",
        "revisions",
        ["at"],
        postgresql_where=_UNFLOORED,
        sqlite_where=_UNFLOORED,
    )
    op.create_index(
        "ix_steps_unattended",
        "workflow_steps",
        ["status", "updated_at"],
        postgresql_where=_UNATTENDED,
        sqlite_where=_UNATTENDED,
    )


def downgrade() -> None:
    op.drop_index("ix_steps_unattended", table_name="workflow_steps")
    op.drop_index("ix_revisions_unfloored", table_name="revisions")
    with op.batch_alter_table("revisions") as batch:
        batch.drop_column("is_floor")
