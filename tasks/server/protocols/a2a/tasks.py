"""A turn as an A2A task: contextId = session, task id = the turn's message id.

A task's state is read from what is stored, never kept apart: the message's inbox row
(queued, started, answered, rolled back), the session's phase (a started turn parked on
an approval is ``input-required``), and the reply it got (a ``cancelled`` reply is
``canceled``, an apology after a failure ``failed``). The reply is the task's one text
artifact and its final status message.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import TaskNotFoundError
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct, Value
from sqlalchemy import Engine

from config import Settings
from state.documents.codec import Document
from state.sessions import turn_records
from state.sessions.snapshot import InboxState
from state.storage.db import read_connection
from tasks.client.aio import AsyncAgentClient
from tasks.server.auth import Caller

REPLY_ARTIFACT = "reply"
TERMINAL = frozenset(
    {
        pb.TASK_STATE_COMPLETED,
        pb.TASK_STATE_FAILED,
        pb.TASK_STATE_CANCELED,
        pb.TASK_STATE_REJECTED,
    }
)
# A reply's kind -> the state of its task (a plain answer, or a clarifying question, is
# completed: the next message opens the next task in the same context).
_REPLY_STATES = {"cancelled": pb.TASK_STATE_CANCELED, "apology": pb.TASK_STATE_FAILED}


@dataclass(frozen=True)
class Door:
    """One A2A call: who calls, on which agent, with the process's client and engine."""

    client: AsyncAgentClient
    engine: Engine
    settings: Settings
    who: Caller
    agent: str


def artifact_id(task_id: str) -> str:
    return f"{task_id}.{REPLY_ARTIFACT}"


def text_part(text: str) -> pb.Part:
    return pb.Part(text=text)


def data_part(data: Document) -> pb.Part:
    value = Value()
    value.struct_value.update(data)
    return pb.Part(data=value)


def agent_message(task_id: str, context_id: str, parts: list[pb.Part], suffix: str) -> pb.Message:
    return pb.Message(
        message_id=f"{task_id}.{suffix}",
        context_id=context_id,
        task_id=task_id,
        role=pb.ROLE_AGENT,
        parts=parts,
    )


def _read(engine: Engine, task_id: str) -> tuple[Document | None, Document | None]:
    with read_connection(engine) as conn:
        record = turn_records.message_row(conn, task_id)
        if record is None or record["state"] != InboxState.ANSWERED:
            return record, None
        return record, turn_records.reply_to(conn, record["session_id"], task_id)


async def record_of(door: Door, task_id: str) -> tuple[Document, Document | None]:
    """The task's message row and its reply; TaskNotFoundError for an unknown id or
    another user's (they read alike)."""
    record, reply = await asyncio.to_thread(_read, door.engine, task_id)
    if record is None or (door.who.user_id is not None and record["user_id"] != door.who.user_id):
        raise TaskNotFoundError(message=f"unknown task {task_id!r}")
    return record, reply


async def pending_approval(door: Door, record: Document) -> Document | None:
    """The approval the task's turn waits on (None: it waits on none)."""
    if record["state"] != InboxState.STARTED:
        return None
    doc = await door.client.get_session(record["session_id"], history_limit=0)
    turn = ((doc or {}).get("metadata") or {}).get("turn") or {}
    if (doc or {}).get("phase") != "awaiting_approval" or turn.get("message_id") != record[
        "message_id"
    ]:
        return None
    for item in await door.client.approvals(user_id=record["user_id"], pending=True):
        if item.get("session_id") == record["session_id"]:
            return item
    return None


async def load(door: Door, task_id: str) -> pb.Task:
    """The task as it stands."""
    record, reply = await record_of(door, task_id)
    approval = await pending_approval(door, record)
    return build(record, reply, approval)


def build(record: Document, reply: Document | None, approval: Document | None) -> pb.Task:
    """The task of a message row, its reply and the approval it waits on."""
    task_id, context_id = record["message_id"], record["session_id"]
    task = pb.Task(id=task_id, context_id=context_id)
    task.history.append(
        pb.Message(
            message_id=task_id,
            context_id=context_id,
            task_id=task_id,
            role=pb.ROLE_USER,
            parts=[text_part(record["text"])],
        )
    )
    state = record["state"]
    if state == InboxState.QUEUED:
        task.status.state = pb.TASK_STATE_SUBMITTED
    elif state == InboxState.ROLLED_BACK:
        task.status.state = pb.TASK_STATE_CANCELED
    elif state == InboxState.STARTED:
        task.status.state = pb.TASK_STATE_WORKING
        if approval is not None:
            task.status.state = pb.TASK_STATE_INPUT_REQUIRED
            task.status.message.CopyFrom(approval_message(task_id, context_id, approval))
    else:
        kind = str((reply or {}).get("kind"))
        task.status.state = _REPLY_STATES.get(kind, pb.TASK_STATE_COMPLETED)
        if reply is not None:
            text = str(reply["content"])
            message = agent_message(task_id, context_id, [text_part(text)], REPLY_ARTIFACT)
            task.status.message.CopyFrom(message)
            task.history.append(message)
            task.artifacts.append(
                pb.Artifact(
                    artifact_id=artifact_id(task_id),
                    name=REPLY_ARTIFACT,
                    parts=[text_part(text)],
                )
            )
    return task


def approval_message(task_id: str, context_id: str, approval: Document) -> pb.Message:
    """What ``input-required`` asks: approve the action? (answered by the next message on
    the task: a data part ``{"approve": bool}`` or the text yes or no)."""
    action = str(approval.get("action", ""))
    details = {
        "approval_id": approval.get("approval_id") or approval.get("approval"),
        "action": action,
        "args": approval.get("args") or {},
        "expires_at": approval.get("expires_at"),
    }
    parts = [text_part(f"approve {action}? answer yes or no"), data_part(details)]
    return agent_message(task_id, context_id, parts, f"asks.{details['approval_id']}")


def metadata_of(struct: Struct) -> Document:
    """A request's metadata as a dict."""
    found: Document = MessageToDict(struct)
    return found
