"""Room on each page of ``workflow_steps`` for a dependent's countdown to stay on its page.

A step's success counts its dependents down; until a dependent is released, that
update changes no indexed column, and with free space on the page it is a HOT update
(no new index entries). A full page (fillfactor 100, the default) makes every such
update write a tuple elsewhere and an entry in each index.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

STEP_FILLFACTOR = 80  # percent of a page filled by inserts (StepRow's table argument)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE workflow_steps SET (fillfactor = {STEP_FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE workflow_steps RESET (fillfactor)")
