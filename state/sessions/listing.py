"""Listing sessions, newest first, by user or phase (each an indexed query)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from state import paging
from state.clock import iso
from state.storage.tables import sessions


def list_sessions(
    engine: Engine,
    *,
    user_id: str | None = None,
    phase: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> paging.Page:
    """A page of session summaries, newest first."""
    query = select(
        sessions.c.session_id,
        sessions.c.user_id,
        sessions.c.phase,
        sessions.c.status,
        sessions.c.revision,
        sessions.c.created_at,
        sessions.c.updated_at,
    )
    if user_id is not None:
        query = query.where(sessions.c.user_id == user_id)
    if phase is not None:
        query = query.where(sessions.c.phase == phase)
    keys = (sessions.c.created_at, sessions.c.session_id)
    return paging.fetch(engine, query, keys, _summary, limit=limit, cursor=cursor)


def _summary(row: Any) -> dict[str, Any]:
    return {
        "session_id": row.session_id,
        "user_id": row.user_id,
        "phase": row.phase,
        "status": row.status,
        "revision": int(row.revision),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }
