"""LangGraph graphs as agents, through real workers: a turn runs the compiled graph from
the session's last checkpoint (kept in agentstate's Postgres), its chunks stream, its reply
is the last AI message, ``interrupt()`` is an approval whose decision resumes the graph,
and a worker killed mid-graph resumes from the last checkpoint (earlier nodes do not run
again)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from config import Settings
from state.storage.db import get_engine
from tasks.client import AgentClient
from tasks.integrations.langgraph_saver import checkpoints
from tests.graphs import runs_key
from tests.services import Beat
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers

PROJECT = Path(__file__).resolve().parents[1] / "data" / "langgraph_project"
AGENTS = "echo=tests.graphs:echo,steps=tests.graphs:steps,approve=tests.graphs:approve"


@pytest.fixture(scope="module", params=["every_phase", "inline"])
def lg_settings(pg_url: str, request: pytest.FixtureRequest) -> Settings:
    # Short leases and a quick sweep: a killed worker's turn is taken up within seconds.
    # Both hop policies: the guarantees must not depend on it.
    return agent_test_settings(
        pg_url,
        agents=AGENTS,
        langgraph_config=str(PROJECT / "langgraph.json"),
        stuck_after=2.0,
        sweep_interval=1.0,
        lock_timeout=3.0,
        hop_policy=request.param,
    )


@pytest.fixture(scope="module")
def pool(lg_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    log_dir = tmp_path_factory.mktemp("langgraph")
    workers = Workers(lg_settings, log_dir, count=1).start()
    beat = Beat(lg_settings, log_dir).start()
    yield workers
    beat.stop()
    workers.stop()


@pytest.fixture
def client(lg_settings: Settings, pool: Workers) -> AgentClient:
    return AgentClient(lg_settings)


@pytest.fixture
def counters(lg_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(lg_settings.redis_url, decode_responses=True)


def reply_of(client: AgentClient, session_id: str, timeout: float = 60) -> str:
    session = client.wait_for_idle(session_id, timeout=timeout)
    reply: str = session["message_history"][-1]["content"]
    return reply


def checkpoint_count(settings: Settings, session_id: str) -> int:
    with get_engine(settings.database_url).connect() as conn:
        query = select(func.count()).where(checkpoints.c.session_id == session_id)
        return int(conn.execute(query).scalar_one())


def test_graphs_are_listed_as_langgraph_agents(client: AgentClient) -> None:
    kinds = {agent["name"]: agent["kind"] for agent in client.list_agents()}
    assert kinds == {"default": "phases", "echo": "langgraph", "steps": "langgraph",
                     "approve": "langgraph", "project": "langgraph"}  # fmt: skip


def test_the_graphs_of_a_langgraph_json_are_agents(client: AgentClient) -> None:
    session_id = uid("s")
    client.send_message(session_id, "moved over", user_id=uid("u"), agent="project")
    assert reply_of(client, session_id) == "project says: moved over"


def test_a_turn_runs_the_graph_from_the_sessions_last_checkpoint(
    client: AgentClient, lg_settings: Settings
) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "hello", user_id=user, agent="echo")
    assert reply_of(client, session_id) == "echo: hello (#1)"
    written = checkpoint_count(lg_settings, session_id)
    assert written >= 2  # the input, then after the node (durability "sync")
    # The second turn starts from the first's checkpoint: the thread remembers it.
    client.send_message(session_id, "again", user_id=user)
    assert reply_of(client, session_id) == "echo: again (#2)"
    assert checkpoint_count(lg_settings, session_id) > written
    history = client.get_session(session_id)["message_history"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]


def test_a_graphs_chunks_stream_to_followers(client: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "stream me", user_id=user, agent="echo")
    chunks: list[str] = []
    for event in client.events(session_id, follow=True, tokens=True, timeout=30):
        if event["kind"] == "token":
            chunks.append(event["data"]["text"])
        if event["kind"] == "reply":
            break
    assert reply_of(client, session_id) == "echo: stream me (#1)"
    # The writer's strings, then the node's message.
    assert chunks[:2] == ["echo", ": "]
    assert "echo: stream me (#1)" in chunks


@pytest.mark.parametrize("approve", [True, False])
def test_an_interrupt_is_an_approval_whose_decision_resumes_the_graph(
    client: AgentClient, approve: bool
) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "pay", user_id=user, agent="approve")
    pending = wait_for(lambda: client.approvals(user_id=user, pending=True))
    assert len(pending) == 1
    request = pending[0]
    assert request["session_id"] == session_id
    assert request["action"] == "ask"
    assert request["args"] == {"value": {"amount": 5}}
    client.decide(request["approval_id"], approve, by="ops", note="checked")
    verdict = "approved" if approve else "rejected"
    assert reply_of(client, session_id) == f"transfer {verdict} (checked)"


def test_a_worker_killed_mid_graph_resumes_from_the_last_checkpoint(
    client: AgentClient, pool: Workers, counters: redis.Redis
) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "linger a while", user_id=user, agent="steps")
    wait_for(lambda: counters.get(runs_key(session_id, "slow")))
    pool.kill(pool.alive()[0])  # mid-node: "first" is checkpointed, "slow" is not
    pool.add()
    pool.wait_ready()
    assert reply_of(client, session_id, timeout=90) == "all steps done for linger a while"
    runs = {node: int(counters.get(runs_key(session_id, node)) or 0)
            for node in ("first", "slow", "last")}  # fmt: skip
    assert runs == {"first": 1, "slow": 2, "last": 1}


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError("never happened")


def test_a_graphs_checkpoints_are_erased_with_its_user(
    client: AgentClient, lg_settings: Settings
) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "remember me", user_id=user, agent="echo")
    reply_of(client, session_id)
    assert checkpoint_count(lg_settings, session_id) > 0
    counts = client.erase_user(user)
    assert counts["lg_checkpoints"] >= 2
    assert checkpoint_count(lg_settings, session_id) == 0
    # The id is free again: a new session of that id starts a new thread.
    client.send_message(session_id, "new here", user_id=user, agent="echo")
    assert reply_of(client, session_id) == "echo: new here (#1)"
