"""examples/openai_agents_session.py runs as the guide shows it (a subprocess, the SDK's
``Runner`` with a scripted model, no network), and an agentstate session that real
workers answer reads through ``AgentstateSession`` as the SDK's message items, its turns
and the SDK's items in one history."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from config import Settings
from tasks.client import AgentClient
from tasks.integrations.openai_agents import AgentstateSession
from tests.support import REPO, Workers, settings_env, uid

pytestmark = pytest.mark.workers


def test_the_example_runs_an_sdk_agent_on_an_agentstate_session(pg_settings: Settings) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "openai_agents_session.py")],
        env=settings_env(pg_settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "agent: Good news: order 1234 left the warehouse this morning."
    # The second run saw the first run's conversation, from the session.
    assert lines[1] == "agent: You have asked me 2 questions in this conversation."
    history = [line.split(":", 1)[0].strip() for line in lines[2:-1]]
    assert history == ["user", "tool", "tool", "assistant", "user", "assistant"]
    assert lines[-1] == "erased: 6 history rows"


def test_a_turns_messages_and_the_sdks_items_share_one_history(
    worker_settings: Settings, workers: Workers
) -> None:
    client = AgentClient(worker_settings)
    user, session_id = uid("u"), uid("s")
    session = AgentstateSession(session_id, user, client=client)
    client.send_message(session_id, "what is 6*7?", user_id=user)
    client.wait_for_idle(session_id, user_id=user)
    items = asyncio.run(session.get_items())
    assert items[0] == {"role": "user", "content": "what is 6*7?"}
    assert items[1]["role"] == "assistant" and "42" in items[1]["content"]
    note = {"role": "user", "content": "from the SDK"}
    asyncio.run(session.add_items([note]))
    client.send_message(session_id, "what is 1+1?", user_id=user)
    doc = client.wait_for_idle(session_id, user_id=user)
    assert [m["content"] for m in doc["message_history"]][2:4] == ["from the SDK", "what is 1+1?"]
    assert "2" in doc["message_history"][-1]["content"]
    assert asyncio.run(session.get_items(limit=3))[0] == note
