"""Pydantic AI agents as agentstate turns, through a real worker, with Pydantic AI's offline
``FunctionModel`` deciding (tests/pydantic_agents.py): the session's history reaches the
agent; a tool call and each model request are recorded steps; text deltas reach
``events(..., tokens=True)`` as chunks; an approval-required tool waits for an agentstate
approval, runs once approved, never runs when rejected (the model hears the note); a
worker process SIGKILLed during a slow tool resumes the turn without asking the model again
for the request that had finished; a message naming another agent than the session's is
refused and stores nothing; erasure takes the recorded steps with the session."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from config import Settings
from state.errors import BadInputError
from state.storage.db import get_engine
from state.storage.tables import Base, inbox
from tasks.client import AgentClient
from tests.pydantic_agents import SLOW_S, model_key, tool_key
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers

AGENTS = "pa=tests.pydantic_agents:agent,plain=tests.pydantic_agents:plain"
steps = Base.metadata.tables["agent_steps"]


@pytest.fixture(scope="module")
def pa_settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url, agents=AGENTS)


@pytest.fixture(scope="module")
def pool(pa_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    workers = Workers(pa_settings, tmp_path_factory.mktemp("pydantic-ai"), count=1).start()
    yield workers
    workers.stop()


@pytest.fixture
def client(pa_settings: Settings, pool: Workers) -> AgentClient:
    return AgentClient(pa_settings)


@pytest.fixture
def counters(pa_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(pa_settings.redis_url)


def count(counters: redis.Redis, key: str) -> int:
    return int(counters.get(key) or 0)


def reply_of(client: AgentClient, session_id: str, timeout: float = 60) -> str:
    doc = client.wait_for_idle(session_id, timeout=timeout)
    assert doc["phase"] == "idle", doc["phase"]
    return str(doc["message_history"][-1]["content"])


def recorded(settings: Settings, session_id: str) -> list[tuple[int, str, int]]:
    with get_engine(settings.database_url).connect() as conn:
        rows = conn.execute(
            select(steps.c.run, steps.c.name, steps.c.n).where(steps.c.session_id == session_id)
        ).all()
    return sorted((int(r.run), str(r.name), int(r.n)) for r in rows)


def test_the_agent_is_listed_with_its_kind(client: AgentClient) -> None:
    listed = client.list_agents()
    assert {"name": "pa", "kind": "pydantic-ai"} in listed
    assert {"name": "plain", "kind": "pydantic-ai"} in listed


def test_a_turn_runs_the_agent_with_the_history_and_streams_its_text(
    client: AgentClient,
) -> None:
    user, session_id, token = uid("u"), uid("s"), uid("t")
    client.send_message(session_id, f"hello {token}", user_id=user, agent="pa")
    assert reply_of(client, session_id) == f"You said: hello {token} (0 earlier)"
    chunks: list[dict[str, Any]] = []
    ready = threading.Event()

    def follow() -> None:
        ready.set()
        for event in client.events(
            session_id, after=10**6, follow=True, tokens=True, timeout=30, user_id=user
        ):
            if event["kind"] == "token":
                chunks.append(event["data"])
            if event["kind"] == "reply":
                return

    follower = threading.Thread(target=follow)
    follower.start()
    ready.wait()
    time.sleep(0.5)  # the follower is subscribed
    message_id = client.send_message(session_id, f"again {token}", user_id=user)
    reply = reply_of(client, session_id)
    follower.join(timeout=30)
    assert reply == f"You said: again {token} (2 earlier)"
    assert [c["n"] for c in chunks] == list(range(1, len(chunks) + 1))
    assert len(chunks) > 1 and {c["message_id"] for c in chunks} == {message_id}
    assert "".join(c["text"] for c in chunks) == reply


def test_a_tool_call_and_each_model_request_are_recorded_steps(
    client: AgentClient, counters: redis.Redis, pa_settings: Settings
) -> None:
    for agent in ("pa", "plain"):
        user, session_id, token = uid("u"), uid("s"), uid("t")
        client.send_message(session_id, f"lookup {token}", user_id=user, agent=agent)
        assert reply_of(client, session_id) == f"lookup: found {token}"
        assert count(counters, model_key(token)) == 2
        assert count(counters, tool_key(token)) == 1
        names = [name for _run, name, _n in recorded(pa_settings, session_id)]
        assert sum("request" in name for name in names) == 2, names
        assert sum("lookup" in name for name in names) == 1, names


def test_an_approved_tool_runs_once_and_a_rejected_one_never(
    client: AgentClient, counters: redis.Redis
) -> None:
    user = uid("u")
    approved, rejected = uid("s"), uid("s")
    yes, no = uid("t"), uid("t")
    client.send_message(approved, f"refund {yes}", user_id=user, agent="pa")
    client.send_message(rejected, f"refund {no}", user_id=user, agent="pa")
    for session_id in (approved, rejected):
        assert client.wait_for_idle(session_id, timeout=60)["phase"] == "awaiting_approval"
    asked = {a["session_id"]: a for a in client.approvals(user_id=user)}
    assert asked[approved]["action"] == "refund"
    assert asked[approved]["args"] == {"token": yes}
    assert count(counters, tool_key(yes)) == 0  # nothing ran before the decision
    client.decide(asked[approved]["approval_id"], True, by=user, user_id=user)
    client.decide(asked[rejected]["approval_id"], False, by=user, note="too much", user_id=user)
    assert reply_of(client, approved) == f"refund: refunded {yes}"
    assert reply_of(client, rejected) == "refund: too much"
    assert count(counters, tool_key(yes)) == 1
    assert count(counters, tool_key(no)) == 0
    assert count(counters, model_key(yes)) == 2


def test_a_worker_killed_during_a_slow_tool_resumes_without_asking_the_model_again(
    client: AgentClient, counters: redis.Redis, pool: Workers
) -> None:
    user, session_id, token = uid("u"), uid("s"), uid("t")
    client.send_message(session_id, f"slow {token}", user_id=user, agent="pa")
    deadline = time.monotonic() + 30
    while count(counters, tool_key(token)) == 0:  # the tool has started
        assert time.monotonic() < deadline, "the slow tool never started"
        time.sleep(0.05)
    assert count(counters, model_key(token)) == 1
    (name,) = pool.alive()
    children = pool.children(name)
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)  # mid-tool; the main process requeues the phase
    assert reply_of(client, session_id, timeout=60 + SLOW_S) == f"slow_tool: slowly {token}"
    # The first model request finished before the kill: it is replayed, not asked again.
    assert count(counters, model_key(token)) == 2
    assert count(counters, tool_key(token)) == 2  # the cut-short tool ran again


def test_a_message_naming_another_agent_is_refused_and_stores_nothing(
    client: AgentClient, pa_settings: Settings
) -> None:
    user, session_id, token = uid("u"), uid("s"), uid("t")
    client.send_message(session_id, f"hello {token}", user_id=user, agent="pa")
    reply_of(client, session_id)
    with get_engine(pa_settings.database_url).connect() as conn:
        before = conn.execute(select(func.count()).where(inbox.c.session_id == session_id)).scalar()
    with pytest.raises(BadInputError):
        client.send_message(session_id, "to the other one", user_id=user, agent="default")
    with get_engine(pa_settings.database_url).connect() as conn:
        after = conn.execute(select(func.count()).where(inbox.c.session_id == session_id)).scalar()
    assert after == before


def test_a_session_keeps_one_turns_steps_and_erasure_takes_them(
    client: AgentClient, pa_settings: Settings
) -> None:
    user, session_id, token = uid("u"), uid("s"), uid("t")
    client.send_message(session_id, f"lookup {token}", user_id=user, agent="pa")
    reply_of(client, session_id)
    assert recorded(pa_settings, session_id)
    client.send_message(session_id, f"lookup {uid('t')}", user_id=user)
    reply_of(client, session_id)
    assert len(recorded(pa_settings, session_id)) == 3  # the earlier turn's steps are gone
    erased = client.erase_user(user)
    assert erased["agent_steps"] == 3
    assert recorded(pa_settings, session_id) == []
