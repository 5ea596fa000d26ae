"""The Agent Server protocol's objects, built from agentstate's: an assistant is an agent,
a thread a session, a run a turn (its id the turn's message id), a checkpoint a revision,
an interrupt a pending approval."""

from __future__ import annotations

import uuid
from typing import Any

from state.documents.codec import Document
from state.machine import Phase

# LangGraph's namespace for assistant ids: uuid5(NAMESPACE, graph_id).
ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
EPOCH = "1970-01-01T00:00:00+00:00"
THREAD_METADATA = "thread_metadata"  # the session document's key for a thread's metadata


def assistant_id(graph_id: str) -> str:
    """The id the Agent Server gives the default assistant of ``graph_id``."""
    return str(uuid.uuid5(ASSISTANT_NAMESPACE, graph_id))


def assistant(agent: Document) -> Document:
    """An agent (``{"name", "kind"}``) as an Assistant."""
    name = str(agent["name"])
    return {
        "assistant_id": assistant_id(name),
        "graph_id": name,
        "name": name,
        "description": f"agentstate agent {name!r} ({agent['kind']})",
        "config": {},
        "context": {},
        "metadata": {"kind": agent["kind"]},
        "version": 1,
        "created_at": EPOCH,
        "updated_at": EPOCH,
    }


def thread_status(session: Document) -> str:
    """idle, busy or interrupted (a pending approval)."""
    phase = session.get("phase")
    if phase == Phase.AWAITING_APPROVAL:
        return "interrupted"
    return "idle" if phase in (Phase.IDLE, Phase.CLARIFYING) else "busy"


def message(item: Document, index: int, thread_id: str) -> Document:
    """A history item as a LangGraph message (``human`` or ``ai``)."""
    metadata = item.get("metadata") or {}
    human = item.get("role") == "user"
    if human:
        message_id = metadata.get("message_id") or metadata.get("lg_id") or f"{thread_id}-{index}"
    else:
        # One reply per message: its id is known while its chunks stream, before it ends.
        reply_to = metadata.get("reply_to")
        message_id = (
            reply_id(str(reply_to)) if reply_to else metadata.get("lg_id") or f"{thread_id}-{index}"
        )
    return {
        "type": "human" if human else "ai",
        "content": item.get("content", ""),
        "id": str(message_id),
        "additional_kwargs": {},
        "response_metadata": {},
        "name": None,
    }


def reply_id(run_id: str) -> str:
    """The id of the AI message that answers run ``run_id`` (its chunks carry it too)."""
    return f"{run_id}-reply"


def values(session: Document) -> Document:
    """The thread's values: its messages."""
    thread_id = str(session["session_id"])
    history = session.get("message_history") or []
    return {"messages": [message(item, i, thread_id) for i, item in enumerate(history)]}


def interrupts(pending: list[Document], kinds: dict[str, str]) -> list[Document]:
    """Pending approvals as interrupts: a LangGraph graph's ``interrupt(value)`` gives its
    value back; another agent's approval is an agent-chat-ui action request."""
    found = []
    for approval in pending:
        args = approval.get("args") or {}
        if kinds.get("graph") == "langgraph" and set(args) == {"value"}:
            value: Any = args["value"]
        else:
            value = {
                "action_requests": [
                    {"name": approval["action"], "args": args, "description": approval["action"]}
                ],
                "review_configs": [
                    {"action_name": approval["action"], "allowed_decisions": ["approve", "reject"]}
                ],
            }
        found.append({"id": approval["approval_id"], "value": value})
    return found


def thread(session: Document, pending: list[Document], kind: str) -> Document:
    """A session as a Thread."""
    thread_id = str(session["session_id"])
    found = interrupts(pending, {"graph": kind})
    return {
        "thread_id": thread_id,
        "created_at": session.get("created_at"),
        "updated_at": session.get("updated_at"),
        "metadata": session.get(THREAD_METADATA) or {},
        "status": thread_status(session),
        "values": values(session),
        "interrupts": {thread_id: found} if found else {},
        "config": {},
    }


def checkpoint(thread_id: str, revision: int | None) -> Document | None:
    """A revision as a checkpoint reference."""
    if revision is None:
        return None
    return {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": str(revision)}


def state(session: Document, pending: list[Document], kind: str) -> Document:
    """The thread's state (a ThreadState) at the session's revision."""
    thread_id, revision = str(session["session_id"]), session.get("revision")
    found = interrupts(pending, {"graph": kind})
    resting = thread_status(session) == "idle"
    return {
        "values": values(session),
        "next": [] if resting else [str(session.get("phase"))],
        "tasks": [_task(item, str(session.get("phase"))) for item in found],
        "checkpoint": checkpoint(thread_id, revision),
        "parent_checkpoint": checkpoint(thread_id, revision - 1) if revision else None,
        "metadata": {"step": revision, "source": "loop"},
        "created_at": session.get("updated_at"),
        "interrupts": found,
    }


def _task(interrupt: Document, name: str) -> Document:
    return {
        "id": interrupt["id"],
        "name": name,
        "interrupts": [interrupt],
        "error": None,
        "state": None,
        "checkpoint": None,
        "result": None,
    }


def run(
    thread_id: str, run_id: str, assistant: str, status: str, session: Document | None = None
) -> Document:
    """A turn as a Run."""
    at = (session or {}).get("updated_at") or EPOCH
    return {
        "run_id": run_id,
        "thread_id": thread_id,
        "assistant_id": assistant,
        "created_at": at,
        "updated_at": at,
        "status": status,
        "metadata": {},
        "kwargs": {},
        "multitask_strategy": "enqueue",
    }


def run_status(session: Document, run_id: str) -> str | None:
    """pending, running, interrupted, success or error of the turn ``run_id`` (None: no
    such run in this thread's history)."""
    history = session.get("message_history") or []
    asked = False
    for item in history:
        metadata = item.get("metadata") or {}
        if item.get("role") == "user" and metadata.get("message_id") == run_id:
            asked = True
        elif item.get("role") == "assistant" and metadata.get("reply_to") == run_id:
            kind = metadata.get("kind")
            if kind == "apology":
                return "error"
            return "interrupted" if kind == "cancelled" else "success"
    if not asked:
        return None
    return "interrupted" if thread_status(session) == "interrupted" else "running"


def run_ids(session: Document) -> list[str]:
    """The thread's runs (turns), newest first."""
    history = session.get("message_history") or []
    found = [
        str((item.get("metadata") or {}).get("message_id"))
        for item in history
        if item.get("role") == "user" and (item.get("metadata") or {}).get("message_id")
    ]
    return found[::-1]
