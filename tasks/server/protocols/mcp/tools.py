"""The MCP tools: ``ask_{agent}`` for each agent (a message in, the reply out, as a turn
of a session) and one per registered action (a one-step workflow: the action's declared
inputs in, the step's outputs out). Each call is a turn or a workflow like any other,
seen alike from every door."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import types
from sqlalchemy import Engine

from config import Settings
from state.documents import codec
from state.documents.codec import Document
from state.errors import AgentStateError, NotFoundError, SessionOwnershipError
from state.ids import validate_id
from state.sessions.snapshot import InboxState
from state.workflows.served import ServedActions
from tasks.actions import action_description, action_inputs, known_actions
from tasks.client.aio import AsyncAgentClient
from tasks.server.auth import Caller
from tasks.server.protocols import turns
from tasks.server.protocols.agents import acting_user, known_agents

ASK = "ask_"
ASK_SCHEMA: Document = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "what to say to the agent"},
        "session_id": {
            "type": "string",
            "description": "the conversation to continue (a new one when absent)",
        },
    },
    "required": ["message"],
}
ASK_OUTPUT: Document = {
    "type": "object",
    "properties": {
        "session_id": {"type": "string"},
        "reply": {"type": ["string", "null"]},
        "approval_id": {"type": "string"},
    },
    "required": ["session_id", "reply"],
}

# Every tool may run as an MCP task (``task_calls``): a turn or a workflow either way.
TASKS_OPTIONAL = types.ToolExecution(task_support="optional")


@dataclass(frozen=True)
class Call:
    """One tool call: who calls, with the process's client, engine and settings."""

    client: AsyncAgentClient
    engine: Engine
    settings: Settings
    who: Caller

    @property
    def wait_s(self) -> float:
        """How long a call waits for its turn or workflow (within the request's limit)."""
        return self.settings.request_time_limit * 0.8


async def action_names(call: Call) -> list[str]:
    """The actions a tool is offered for: imported here, or published by a worker."""

    def read() -> list[str]:
        names = set(known_actions(call.settings.action_module_list))
        names |= ServedActions(call.engine).names()
        return sorted(names)

    return await asyncio.to_thread(read)


async def tools(call: Call) -> list[types.Tool]:
    """Every tool of the deployment."""
    found = [
        types.Tool(
            name=f"{ASK}{agent}",
            description=f"Send a message to the agent {agent!r} and get its reply.",
            input_schema=ASK_SCHEMA,
            output_schema=ASK_OUTPUT,
            execution=TASKS_OPTIONAL,
        )
        for agent in known_agents(call.settings)
    ]
    for name in await action_names(call):
        about = action_description(name) or f"Run the workflow action {name!r}."
        found.append(
            types.Tool(
                name=name,
                description=about,
                input_schema=action_inputs(name),
                execution=TASKS_OPTIONAL,
            )
        )
    return found


def result_of(structured: Document, text: str | None = None) -> types.CallToolResult:
    """A tool's answer: ``text`` (else the structured content's JSON) and the structure."""
    shown = text if text is not None else codec.dumps(structured)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=shown)], structured_content=structured
    )


def failure(message: str) -> types.CallToolResult:
    """A tool error the model can read (bad arguments, an unknown session...)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


async def call_tool(call: Call, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """Run tool ``name``; an error of the caller's making is a tool error, not a crash."""
    try:
        if name.startswith(ASK) and name[len(ASK) :] in known_agents(call.settings):
            return await ask(call, name[len(ASK) :], arguments)
        if name in await action_names(call):
            return await run_action(call, name, arguments)
        return failure(f"unknown tool {name!r}")
    except (NotFoundError, SessionOwnershipError):
        return failure("unknown session")
    except AgentStateError as exc:
        return failure(str(exc))


async def ask(call: Call, agent: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """A turn: the message sent to the session (a new one when none is named), the reply
    once the turn answers (or the approval it waits on)."""
    text = arguments.get("message")
    if not isinstance(text, str) or not text:
        return failure("'message' (a non-empty string) is required")
    session_id = validate_id(arguments.get("session_id") or f"mcp-{uuid.uuid4().hex}", "session")
    found = await turns.head(call.engine, session_id)
    owner = found[1] if found is not None else None
    if owner is not None and call.who.user_id not in (None, owner):
        return failure("unknown session")
    user = acting_user(call.who, owner)
    message_id = await call.client.send_message(session_id, text, user_id=user, agent=agent)
    state = await turns.message_state(call.engine, session_id, message_id)
    after = found[0] if found is not None else 0
    items = turns.watch(
        call.client,
        session_id,
        message_id,
        after,
        call.who.user_id,
        started=state != InboxState.QUEUED,
    )
    answer: Document = {"session_id": session_id, "reply": None}
    with anyio.move_on_after(call.wait_s):
        async for item in items:
            if isinstance(item, turns.Reply):
                answer["reply"] = item.text
            elif isinstance(item, turns.ApprovalAsked):
                answer["approval_id"] = item.approval_id
    if answer["reply"] is None and "approval_id" not in answer:
        answer["status"] = "working"  # still going past the wait: the session tells the rest
    return result_of(answer, answer["reply"])


async def run_action(call: Call, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """A one-step workflow of action ``name``; the step's outputs once it finishes."""
    owner = call.who.user_id or acting_user(call.who, None)
    spec = {"steps": [{"step_id": "run", "action": name, "inputs": arguments}]}
    workflow_id = await call.client.start_workflow(spec, user_id=owner)
    try:
        done = await call.client.wait_for_workflow(
            workflow_id, timeout=call.wait_s, user_id=call.who.user_id
        )
    except TimeoutError:
        return result_of({"workflow_id": workflow_id, "status": "running"})
    step = done["steps"]["run"]
    if done["status"] != "success":
        return failure(f"action {name!r} failed: {step.get('error') or done['status']}")
    outputs: Document = dict(step.get("outputs") or {})
    return result_of(outputs)
