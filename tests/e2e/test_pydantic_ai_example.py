"""examples/pydantic_ai_agent.py as the guide runs it: a worker with ``examples/`` on its
path and AGENTSTATE_AGENTS naming the agent; a turn asks for the refund's approval, and
once approved answers with what both tools returned."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.support import REPO, Workers, make_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def example_settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"), agents="support=pydantic_ai_agent:agent")


@pytest.fixture(scope="module")
def client(
    example_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(example_settings, tmp_path_factory.mktemp("pydantic-ai-example"), count=1)
    pool.env["PYTHONPATH"] = f"{REPO / 'examples'}:{pool.env['PYTHONPATH']}"  # as the guide says
    pool.start()
    # The app names the agents too (it checks a message's agent by name; it imports none).
    yield AgentClient(example_settings)
    pool.stop()


def test_the_support_agent_asks_before_refunding_then_answers(client: AgentClient) -> None:
    user, session_id = uid("ada"), uid("support")
    client.send_message(session_id, "Where is order 1234?", user_id=user, agent="support")
    assert client.wait_for_idle(session_id, timeout=60)["phase"] == "awaiting_approval"
    (request,) = client.approvals(user_id=user)
    assert request["action"] == "refund" and set(request["args"]) == {"order_id"}
    client.decide(request["approval_id"], True, by=user, user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    reply = doc["message_history"][-1]["content"]
    assert "left the warehouse" in reply and "refunded" in reply, reply
