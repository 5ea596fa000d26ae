"""MCP Tasks (protocol revision 2025-11-25): a ``tools/call`` with ``params.task`` answers at
once with a task, backed by what the call started: ``turn.{message_id}`` for an agent's
tool (its turn), ``workflow.{workflow_id}`` for an action's (its one-step workflow).
Nothing is kept apart: ``tasks/get`` reads the turn or workflow as stored (a turn parked
on an approval, or a workflow step waiting on one, is ``input_required``), ``tasks/result``
waits for the end and answers what the plain call would have, ``tasks/cancel`` cancels
the turn or workflow. Another user's task, or an unknown one, answers as missing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from mcp import types
from mcp.shared.exceptions import MCPError
from sqlalchemy import Engine, literal, select, union_all

from state.clock import iso, utcnow
from state.documents.codec import Document
from state.errors import AgentStateError, NotFoundError
from state.ids import validate_id
from state.storage.db import read_connection
from state.storage.tables import inbox, workflows
from tasks.server.protocols import turns
from tasks.server.protocols.a2a import tasks as a2a_tasks
from tasks.server.protocols.a2a.tasks import Door
from tasks.server.protocols.agents import acting_user, known_agents
from tasks.server.protocols.mcp import tools
from tasks.server.protocols.mcp.tools import ASK, Call

TURN, WORKFLOW = "turn.", "workflow."
# What a call made as a task is marked with: its message's idempotency key, or its
# workflow's id, starts so (tasks/list finds them by it).
MARK = "mcp-task-"
PAGE = 50
POLL_MS = 1000
INVALID_PARAMS = -32602
_TURN_STATES: dict[int, types.TaskStatus] = {
    pb.TASK_STATE_SUBMITTED: "working",
    pb.TASK_STATE_WORKING: "working",
    pb.TASK_STATE_INPUT_REQUIRED: "input_required",
    pb.TASK_STATE_COMPLETED: "completed",
    pb.TASK_STATE_FAILED: "failed",
    pb.TASK_STATE_REJECTED: "failed",
    pb.TASK_STATE_CANCELED: "cancelled",
}
_WORKFLOW_STATES: dict[str, types.TaskStatus] = {
    "success": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
FINISHED = frozenset({"completed", "failed", "cancelled"})


def missing(task_id: str) -> MCPError:
    return MCPError(INVALID_PARAMS, f"unknown task {task_id!r}")


def _door(call: Call) -> Door:
    return Door(call.client, call.engine, call.settings, call.who, "")


def _task(task_id: str, status: types.TaskStatus, created: str, message: str | None) -> Any:
    return {
        "task_id": task_id,
        "status": status,
        "status_message": message,
        "created_at": created,
        "last_updated_at": iso(utcnow()),
        "ttl": None,
        "poll_interval": POLL_MS,
    }


async def start(call: Call, name: str, arguments: dict[str, Any]) -> Document:
    """Start what tool ``name`` does and answer with its task, without waiting."""
    if name.startswith(ASK) and name[len(ASK) :] in known_agents(call.settings):
        text = arguments.get("message")
        if not isinstance(text, str) or not text:
            raise MCPError(INVALID_PARAMS, "'message' (a non-empty string) is required")
        session_id = validate_id(
            arguments.get("session_id") or f"mcp-{uuid.uuid4().hex}", "session"
        )
        found = await turns.head(call.engine, session_id)
        owner = found[1] if found is not None else None
        if owner is not None and call.who.user_id not in (None, owner):
            raise MCPError(INVALID_PARAMS, "unknown session")
        message_id = await call.client.send_message(
            session_id,
            text,
            user_id=acting_user(call.who, owner),
            agent=name[len(ASK) :],
            idempotency_key=f"{MARK}{uuid.uuid4().hex}",  # marks it as a task (tasks/list)
        )
        task_id = TURN + message_id
    elif name in await tools.action_names(call):
        owner_id = call.who.user_id or acting_user(call.who, None)
        spec = {
            "workflow_id": f"{MARK}{uuid.uuid4().hex}",  # marks it as a task (tasks/list)
            "steps": [{"step_id": "run", "action": name, "inputs": arguments}],
        }
        task_id = WORKFLOW + await call.client.start_workflow(spec, user_id=owner_id)
    else:
        raise MCPError(INVALID_PARAMS, f"unknown tool {name!r}")
    return _wire((await _read(call, task_id))[0])


async def _read(call: Call, task_id: str) -> tuple[Any, Any]:
    """The task as stored, and what it is built from (an A2A task, or a workflow)."""
    try:
        if task_id.startswith(TURN):
            turn = await a2a_tasks.load(_door(call), task_id[len(TURN) :])
            record, _ = await a2a_tasks.record_of(_door(call), task_id[len(TURN) :])
            status = _TURN_STATES[turn.status.state]
            message = "waiting on an approval" if status == "input_required" else None
            return _task(task_id, status, str(record["created_at"]), message), turn
        if task_id.startswith(WORKFLOW):
            workflow_id = task_id[len(WORKFLOW) :]
            doc = await call.client.get_workflow(workflow_id, user_id=call.who.user_id)
            if doc is None:
                raise missing(task_id)
            status = _WORKFLOW_STATES.get(str(doc["status"]), "working")
            if status == "working" and await _asks(call, workflow_id):
                status = "input_required"
            return _task(task_id, status, str(doc.get("created_at") or ""), None), doc
    except (A2AError, NotFoundError):
        raise missing(task_id) from None
    except AgentStateError as exc:
        raise MCPError(INVALID_PARAMS, str(exc)) from None
    raise missing(task_id)


async def _asks(call: Call, workflow_id: str) -> bool:
    pending = await call.client.approvals(user_id=call.who.user_id, pending=True)
    return any(item.get("workflow_id") == workflow_id for item in pending)


async def get(call: Call, task_id: str) -> Document:
    return _wire((await _read(call, task_id))[0])


def _wire(task: Any) -> Document:
    """A task as the wire has it (``ttl`` stays, null: unlimited)."""
    shown: Document = types.Task(**task).model_dump(by_alias=True, mode="json", exclude_none=True)
    shown["ttl"] = task["ttl"]
    return shown


METHODS = frozenset({"tasks/get", "tasks/result", "tasks/cancel", "tasks/list"})


def is_task_request(method: object, params: object) -> bool:
    """Whether a JSON-RPC request is one of the Tasks methods (or a task-augmented
    ``tools/call``)."""
    if method == "tools/call":
        return isinstance(params, dict) and isinstance(params.get("task"), dict)
    return method in METHODS


async def answer(call: Call, method: str, params: object) -> Document:
    """The result of a Tasks request (MCPError for a bad one)."""
    if params is None and method == "tasks/list":  # its params are all optional
        params = {}
    if not isinstance(params, dict):
        raise MCPError(INVALID_PARAMS, f"{method} needs params")
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise MCPError(INVALID_PARAMS, "a tool call needs a name and arguments")
        return {"task": await start(call, name, arguments)}
    if method == "tasks/list":
        return await listing(call, params.get("cursor"))
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        raise MCPError(INVALID_PARAMS, f"{method} needs params.taskId")
    if method == "tasks/get":
        return await get(call, task_id)
    if method == "tasks/cancel":
        return await cancel(call, task_id)
    found: Document = (await result(call, task_id)).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    return found


async def result(call: Call, task_id: str) -> types.CallToolResult:
    """What the plain call answers, once the task ends (or waits on an approval); a task
    still going past the request's wait answers as it stands."""
    task, source = await _read(call, task_id)
    with anyio.move_on_after(call.wait_s):
        while task["status"] not in FINISHED and task["status"] != "input_required":
            await anyio.sleep(POLL_MS / 1000 / 4)
            task, source = await _read(call, task_id)
    meta = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    if task_id.startswith(TURN):
        turn: pb.Task = source
        reply = "".join(p.text for a in turn.artifacts for p in a.parts) or None
        answer: Document = {"session_id": turn.context_id, "reply": reply, "status": task["status"]}
        made = tools.result_of(answer, reply)
    else:
        doc: Document = source
        step = (doc.get("steps") or {}).get("run") or {}
        if task["status"] == "completed":
            made = tools.result_of(dict(step.get("outputs") or {}))
        elif task["status"] in FINISHED:
            made = tools.failure(f"the action {task['status']}: {step.get('error') or ''}")
        else:
            made = tools.result_of({"workflow_id": doc["workflow_id"], "status": task["status"]})
    made.meta = meta
    return made


async def cancel(call: Call, task_id: str) -> Document:
    task, source = await _read(call, task_id)
    if task["status"] in FINISHED:
        raise MCPError(INVALID_PARAMS, f"task {task_id!r} is {task['status']}: nothing to cancel")
    if task_id.startswith(TURN):
        await call.client.cancel_turn(source.context_id, user_id=call.who.user_id)
    else:
        await call.client.cancel_workflow(source["workflow_id"], user_id=call.who.user_id)
    return _wire((await _read(call, task_id))[0])


def _marked(engine: Engine, user_id: str | None, skip: int) -> list[str]:
    """The task ids of the calls made as tasks (of ``user_id``, if given), newest first."""
    turn_rows = select(
        inbox.c.message_id.label("id"), inbox.c.created_at, literal(TURN).label("kind")
    ).where(inbox.c.idempotency_key.like(f"{MARK}%"))
    flows = select(
        workflows.c.workflow_id.label("id"), workflows.c.created_at, literal(WORKFLOW).label("kind")
    ).where(workflows.c.workflow_id.like(f"{MARK}%"))
    if user_id is not None:
        turn_rows = turn_rows.where(inbox.c.user_id == user_id)
        flows = flows.where(workflows.c.user_id == user_id)
    both = union_all(turn_rows, flows).subquery()
    query = (
        select(both.c.id, both.c.kind)
        .order_by(both.c.created_at.desc(), both.c.id)
        .offset(skip)
        .limit(PAGE + 1)
    )
    with read_connection(engine) as conn:
        return [f"{row.kind}{row.id}" for row in conn.execute(query)]


async def listing(call: Call, cursor: object) -> Document:
    """``tasks/list``: the caller's tasks, newest first, ``PAGE`` at a time."""
    if cursor is not None and (not isinstance(cursor, str) or not cursor.isdigit()):
        raise MCPError(INVALID_PARAMS, "invalid cursor")
    skip = int(cursor or 0)
    found = await asyncio.to_thread(_marked, call.engine, call.who.user_id, skip)
    page: Document = {"tasks": [await get(call, task_id) for task_id in found[:PAGE]]}
    if len(found) > PAGE:
        page["nextCursor"] = str(skip + PAGE)
    return page
