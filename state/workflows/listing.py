"""Listing workflows, newest first, by session or status (each an indexed query)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from state import paging
from state.clock import iso
from state.storage.tables import workflows


def list_workflows(
    engine: Engine,
    *,
    session_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    user_id: str | None = None,
) -> paging.Page:
    """A page of workflow summaries (no steps, no payloads), newest first; with
    ``user_id``, that user's only (``ix_workflows_user_created``)."""
    query = select(
        workflows.c.workflow_id,
        workflows.c.session_id,
        workflows.c.status,
        workflows.c.total_steps,
        workflows.c.remaining_steps,
        workflows.c.failed_steps,
        workflows.c.created_at,
        workflows.c.finished_at,
    )
    if user_id is not None:
        query = query.where(workflows.c.user_id == user_id)
    if session_id is not None:
        query = query.where(workflows.c.session_id == session_id)
    if status is not None:
        query = query.where(workflows.c.status == status)
    keys = (workflows.c.created_at, workflows.c.workflow_id)
    return paging.fetch(engine, query, keys, _summary, limit=limit, cursor=cursor)


def _summary(row: Any) -> dict[str, Any]:
    return {
        "workflow_id": row.workflow_id,
        "session_id": row.session_id,
        "status": row.status,
        "total_steps": int(row.total_steps),
        "done_steps": int(row.total_steps) - int(row.remaining_steps),
        "failed_steps": int(row.failed_steps),
        "created_at": iso(row.created_at),
        "finished_at": iso(row.finished_at),
    }
