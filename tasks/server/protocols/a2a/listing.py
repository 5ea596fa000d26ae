"""``ListTasks``: the caller's turns as tasks, newest first, a page at a time (the page
token is the last task's ``created_at|message_id``), optionally of one context and in one
state."""

from __future__ import annotations

import asyncio
from datetime import datetime

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError
from sqlalchemy import Engine

from state.documents.codec import Document
from state.sessions import turn_records
from state.sessions.snapshot import InboxState
from state.storage.db import read_connection
from tasks.server.protocols.a2a import tasks as a2a_tasks
from tasks.server.protocols.a2a.tasks import Door

DEFAULT_PAGE = 50


def _cursor(token: str) -> tuple[datetime, str] | None:
    if not token:
        return None
    at, _, message_id = token.partition("|")
    try:
        return datetime.fromisoformat(at), message_id
    except ValueError:
        raise InvalidParamsError(message="pageToken is not one this server gave") from None


def _read(
    engine: Engine, door: Door, params: pb.ListTasksRequest, limit: int
) -> list[tuple[Document, Document | None]]:
    with read_connection(engine) as conn:
        rows = turn_records.user_turns(
            conn,
            door.who.user_id,
            params.context_id or None,
            _cursor(params.page_token),
            limit,
        )
        return [
            (
                row,
                turn_records.reply_to(conn, row["session_id"], row["message_id"])
                if row["state"] == InboxState.ANSWERED
                else None,
            )
            for row in rows
        ]


async def list_tasks(door: Door, params: pb.ListTasksRequest, most: int) -> pb.ListTasksResponse:
    """One page of the caller's tasks."""
    limit = min(params.page_size or DEFAULT_PAGE, most)
    found = await asyncio.to_thread(_read, door.engine, door, params, limit)
    answer = pb.ListTasksResponse(page_size=limit)
    for record, reply in found:
        approval = await a2a_tasks.pending_approval(door, record)
        task = a2a_tasks.build(record, reply, approval)
        if params.status and task.status.state != params.status:
            continue
        if not params.include_artifacts:
            del task.artifacts[:]
        answer.tasks.append(task)
    answer.total_size = len(answer.tasks)
    if len(found) == limit:
        last = found[-1][0]
        answer.next_page_token = f"{last['created_at']}|{last['message_id']}"
    return answer
