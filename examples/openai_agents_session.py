"""An OpenAI Agents SDK agent whose conversation lives in agentstate (docs/guides/openai-agents.md).

``AgentstateSession`` is the SDK's ``Session``: ``Runner.run`` reads the conversation from
it and writes each run's items to it. They are the agentstate session's history, so the
console shows them, ``agentstate session show`` prints them, and ``erase_user`` deletes
them with the rest of the user's data.

The model here is a small scripted one (no network, no key): it looks the order up with
the tool, then answers from the tool's output; asked again, it counts the questions it
can see in the conversation the session gave it. A real agent names its model as usual
(``Agent(..., model="gpt-5")``). Run it where agentstate's database and Redis answer (no
worker is needed: the SDK runs the agent in this process):

    pip install 'agentstate-celery[openai-agents]'
    python examples/openai_agents_session.py

tests/e2e/test_openai_agents_example.py runs it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    Runner,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from tasks.client import AgentClient
from tasks.integrations.openai_agents import AgentstateSession


@function_tool
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id} left the warehouse this morning"


class ScriptedModel(Model):
    """Calls ``order_status`` for a question that names an order, then answers from the
    tool's output; otherwise counts the user's questions in the conversation it is given
    (which the session supplies)."""

    async def get_response(
        self, system_instructions: str | None, input: str | list[Any], *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        last = items[-1]
        if last.get("type") == "function_call_output":
            return _reply(f"Good news: {last['output']}.")
        question = str(last.get("content", ""))
        if "order" in question and any(ch.isdigit() for ch in question):
            order_id = "".join(ch for ch in question if ch.isdigit())
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call-{uuid.uuid4().hex[:8]}",
                name="order_status",
                arguments=f'{{"order_id": "{order_id}"}}',
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        asked = sum(1 for item in items if item.get("role") == "user")
        return _reply(f"You have asked me {asked} questions in this conversation.")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")


def _reply(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id=f"msg-{uuid.uuid4().hex[:8]}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )
    return ModelResponse(output=[message], usage=Usage(), response_id=None)


def main() -> None:
    set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's service
    agent = Agent(
        name="support",
        instructions="Answer questions about orders.",
        model=ScriptedModel(),
        model_settings=ModelSettings(),
        tools=[order_status],
    )
    client = AgentClient()
    user, session_id = f"ada-{uuid.uuid4().hex[:8]}", f"support-{uuid.uuid4().hex[:8]}"
    session = AgentstateSession(session_id, user, client=client)

    first = Runner.run_sync(agent, "Where is order 1234?", session=session)
    print("agent:", first.final_output)
    second = Runner.run_sync(agent, "And how many questions is that?", session=session)
    print("agent:", second.final_output)

    # The same conversation, as agentstate keeps it: the console shows these rows.
    doc = client.get_session(session_id, user_id=user)
    assert doc is not None
    for message in doc["message_history"]:
        print(f"  {message['role']:>9}: {message['content']}")
    print("erased:", client.erase_user(user)["messages"], "history rows")


if __name__ == "__main__":
    main()
