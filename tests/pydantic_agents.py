"""Pydantic AI agents for the tests (AGENTSTATE_AGENTS=pa=tests.pydantic_agents:agent), on
Pydantic AI's own offline ``FunctionModel``: no network, every decision scripted.

The model reads the turn's message (its last word is a token the test chose, naming the
Redis counters of that turn): "lookup T" calls the ``lookup`` tool, then answers with what
it said; "slow T" calls ``slow_tool``, which takes SLOW_S (a window to kill the worker);
"refund T" calls ``refund``, which requires a person's approval, then answers with the
tool's result or the denial the model got; anything else is answered "You said: ...",
streamed in pieces, with the number of earlier messages it was given. Every model request
and every tool run counts in Redis (``model_key``, ``tool_key``), so a test sees what ran
again after a worker died.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from config import get_settings
from state.storage.redis_client import get_redis
from tasks.integrations.pydantic_ai import AgentstateDurability

SLOW_S = 4.0
TOOLS = {"lookup": "lookup", "slow": "slow_tool", "refund": "refund"}


def model_key(token: str) -> str:
    return f"test:pydantic-ai:model:{token}"


def tool_key(token: str) -> str:
    return f"test:pydantic-ai:tool:{token}"


def _count(key: str) -> None:
    get_redis(get_settings().redis_url).incr(key)


def _prompt(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _decide(messages: list[ModelMessage]) -> ModelResponse:
    """What the model answers: a tool call, or text."""
    prompt = _prompt(messages)
    words = prompt.split()
    token = words[-1] if words else "none"
    _count(model_key(token))
    last = messages[-1]
    returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"{returned[0].tool_name}: {returned[0].content}")])
    tool = TOOLS.get(words[0]) if words else None
    if tool is not None:
        return ModelResponse(
            parts=[ToolCallPart(tool, {"token": token}, tool_call_id=f"c-{token}")]
        )
    earlier = sum(
        1 for m in messages[:-1] for p in m.parts if isinstance(p, UserPromptPart | TextPart)
    )
    return ModelResponse(parts=[TextPart(f"You said: {prompt} ({earlier} earlier)")])


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return _decide(messages)


async def stream(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
    answer = _decide(messages)
    part = answer.parts[0]
    if isinstance(part, ToolCallPart):
        yield {
            0: DeltaToolCall(
                name=part.tool_name,
                json_args=part.args_as_json_str(),
                tool_call_id=part.tool_call_id,
            )
        }
        return
    assert isinstance(part, TextPart)
    for i in range(0, len(part.content), 8):
        yield part.content[i : i + 8]


agent: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(respond, stream_function=stream),
    name="pa",
    output_type=[str, DeferredToolRequests],
    capabilities=[AgentstateDurability()],
)


@agent.tool_plain
def lookup(token: str) -> str:
    """Look the token up."""
    _count(tool_key(token))
    return f"found {token}"


@agent.tool_plain
def slow_tool(token: str) -> str:
    """Take a while."""
    _count(tool_key(token))
    time.sleep(SLOW_S)
    return f"slowly {token}"


@agent.tool_plain(requires_approval=True)
def refund(token: str) -> str:
    """Refund, once a person says yes."""
    _count(tool_key(token))
    return f"refunded {token}"


# The same agent without the capability: agentstate adds it for its runs.
plain: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(respond, stream_function=stream),
    name="plain",
    output_type=[str, DeferredToolRequests],
)
plain.tool_plain(lookup)
