"""A2A push notification configs as webhooks limited to one task: ``webhooks`` gets
``a2a_task`` (the task, i.e. the turn's message id), ``a2a_config`` (the config's id, unique
per task), ``a2a_token`` (sent back as ``X-A2A-Notification-Token``) and ``a2a_auth`` (an
``Authorization`` header to send). The outbox triggers of 0020 are redone with one more
condition: a task's hook hears that task only (a turn's reply names its message; an approval
belongs to the session's started turn).

Revision ID: 0028
Revises: 0026
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0026"
branch_labels = None
depends_on = None

ID = sa.String(128)
_STARTED = (
    "(SELECT i.message_id FROM inbox i WHERE i.session_id = {session} "
    "AND i.state = 'started' LIMIT 1)"
)
_SESSION_CLAUSE = "AND (w.session_id IS NULL OR w.session_id = {session});"


def _first() -> Any:
    return importlib.import_module("state.storage.schema.versions.0020_schedules_webhooks")


def _postgres_outbox(with_task: bool) -> str:
    """0020's ``agentstate_outbox`` function, with (or without) the task condition."""
    text: str = _first()._POSTGRES_OUTBOX.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    if not with_task:
        return text
    clause = _SESSION_CLAUSE.format(session="session")
    task = (
        "AND (w.session_id IS NULL OR w.session_id = session)\n"
        "    AND (w.a2a_task IS NULL OR w.a2a_task = coalesce(data->>'message_id', "
        + _STARTED.format(session="session")
        + "));"
    )
    assert clause in text
    return text.replace(clause, task)


def _sqlite_triggers(with_task: bool) -> list[str]:
    """0020's SQLite triggers, with (or without) the task condition: the turn's by its
    reply's message id, the approvals' by the started turn, a workflow's never."""
    statements: list[str] = list(_first().SQLITE_TRIGGERS)
    if not with_task:
        return statements
    clause = _SESSION_CLAUSE.format(session="NEW.session_id")
    tasks = (
        "json_extract(NEW.data, '$.message_id')",
        _STARTED.format(session="NEW.session_id"),
        _STARTED.format(session="NEW.session_id"),
        "NULL",
    )
    done = []
    for statement, task in zip(statements, tasks, strict=True):
        assert clause in statement
        done.append(
            statement.replace(
                clause,
                clause[:-1] + f"\n    AND (w.a2a_task IS NULL OR w.a2a_task = {task});",
            )
        )
    return done


def _redo(with_task: bool) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_postgres_outbox(with_task))
        return
    for name in _first().SQLITE_TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for statement in _sqlite_triggers(with_task):
        op.execute(statement)


def upgrade() -> None:
    with op.batch_alter_table("webhooks") as batch:
        batch.add_column(sa.Column("a2a_task", sa.String(64)))
        batch.add_column(sa.Column("a2a_config", ID))
        batch.add_column(sa.Column("a2a_token", sa.Text()))
        batch.add_column(sa.Column("a2a_auth", sa.Text()))
    op.create_index("uq_webhooks_a2a", "webhooks", ["a2a_task", "a2a_config"], unique=True)
    _redo(with_task=True)


def downgrade() -> None:
    _redo(with_task=False)
    op.drop_index("uq_webhooks_a2a", table_name="webhooks")
    with op.batch_alter_table("webhooks") as batch:
        for column in ("a2a_auth", "a2a_token", "a2a_config", "a2a_task"):
            batch.drop_column(column)
