"""``AGENTSTATE_MAX_PENDING_APPROVALS``: how many undecided approvals one user may have.

Checked inside the transaction that asks (a workflow's start or retry), before anything
is inserted, so a refused request stores nothing. On Postgres the user's askers are
serialised by a transaction-scoped advisory lock: two racing starts each count the
other's requests, so together they cannot pass the limit (SQLite's writers hold the
whole database already).
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select, text

from state.clock import utcnow
from state.errors import QuotaExceededError
from state.storage.db import is_postgres
from state.storage.tables import approvals

SETTING = "AGENTSTATE_MAX_PENDING_APPROVALS"


def reserve(conn: Connection, user_id: str | None, adding: int, limit: int | None) -> None:
    """QuotaExceededError (naming the setting) unless ``user_id`` may have ``adding``
    more undecided approvals; a request of nobody's (operator code) is not counted."""
    if user_id is None or limit is None or adding <= 0:
        return
    if adding > limit:
        raise _refused(user_id, adding, 0, limit)
    if is_postgres(conn):
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"agentstate:approvals:{user_id}"},
        )
    # Expired requests beat has not rejected yet no longer wait for anyone: not counted.
    pending = conn.execute(
        select(func.count())
        .select_from(approvals)
        .where(
            approvals.c.user_id == user_id,
            approvals.c.decision.is_(None),
            approvals.c.expires_at > utcnow(),
        )
    ).scalar_one()
    if pending + adding > limit:
        raise _refused(user_id, adding, pending, limit)


def _refused(user_id: str, adding: int, pending: int, limit: int) -> QuotaExceededError:
    return QuotaExceededError(
        f"user {user_id!r} has {pending} undecided approvals and asks for {adding} more: "
        f"{SETTING} is {limit}; decide some first (nothing was stored)"
    )
