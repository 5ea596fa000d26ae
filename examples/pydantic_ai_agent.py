"""A Pydantic AI agent that runs as durable agentstate turns (docs/guides/pydantic-ai.md).

Workers load it by name, beside (or instead of) the default agent:

    pip install 'agentstate-celery[pydantic-ai]'
    PYTHONPATH=examples AGENTSTATE_AGENTS=support=pydantic_ai_agent:agent \
        celery -A tasks worker

and an app sends it a session's first message with ``send_message(..., agent="support")``.
Every model request and every tool call of a turn is a recorded step: a worker that dies
mid-turn is replaced, and the turn goes on from its last finished step. ``refund``
requires a person's approval: the turn waits for it as for any agentstate approval.

The model here is Pydantic AI's offline ``TestModel`` ("test": it calls every tool, then
answers with what they returned), so the example runs anywhere; name yours as usual
("openai:gpt-5", "anthropic:claude-sonnet-4-5", ...). tests/e2e/test_pydantic_ai_example.py
runs this file through a real worker.
"""

from __future__ import annotations

from pydantic_ai import Agent, DeferredToolRequests

from tasks.integrations.pydantic_ai import AgentstateDurability

agent: Agent[None, str | DeferredToolRequests] = Agent(
    "test",
    name="support",
    instructions="You help customers with their orders.",
    # DeferredToolRequests: how Pydantic AI lets a run stop for an approval.
    output_type=[str, DeferredToolRequests],
    capabilities=[AgentstateDurability()],
)


@agent.tool_plain
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id} left the warehouse this morning"


@agent.tool_plain(requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order: a person approves it first."""
    return f"order {order_id} refunded"
