"""Per-user counts of stored things (schedules, webhooks) checked before one more is added.

Counted inside the adding transaction; on Postgres the user's adders are serialised by a
transaction-scoped advisory lock, so two racing adds count each other (SQLite's writers
hold the whole database already)."""

from __future__ import annotations

from sqlalchemy import Connection, Table, func, select, text

from state.errors import QuotaExceededError
from state.storage.db import is_postgres


def reserve_one(conn: Connection, table: Table, user_id: str, limit: int, setting: str) -> None:
    """QuotaExceededError naming ``setting`` if ``user_id`` already has ``limit`` rows in
    ``table``."""
    if is_postgres(conn):
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"agentstate:{table.name}:{user_id}"},
        )
    count = conn.execute(
        select(func.count()).select_from(table).where(table.c.user_id == user_id)
    ).scalar_one()
    if count >= limit:
        raise QuotaExceededError(
            f"user {user_id!r} has {count} {table.name}: {setting} is {limit}; "
            "remove one first (nothing was stored)"
        )
