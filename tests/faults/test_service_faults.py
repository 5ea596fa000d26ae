"""Redis flushed or down, Postgres restarted, commit acknowledgements lost.

Each test runs its own Redis or Postgres server, so the machine's services are untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from config import HopPolicy, Settings
from state.storage.db import get_engine, upgrade_schema
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.faults.helpers import (
    HOP_POLICIES,
    assert_answered_exactly_once,
    fault_settings,
    running,
    send_waves,
    wait_all_idle,
)
from tests.services import Beat, CommitDropper, PrivatePostgres, PrivateRedis
from tests.support import BROKER_URL, PG_URL, REDIS_URL, Workers, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture(params=HOP_POLICIES)
def hop_policy(request: pytest.FixtureRequest) -> HopPolicy:
    """Every fault test runs under both hop policies: the guarantees must not depend on it."""
    return HopPolicy(request.param)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis().start()
    yield server
    server.close()


@pytest.fixture
def private_pg(redis_url: str) -> Iterator[PrivatePostgres]:
    server = PrivatePostgres().start()
    yield server
    server.close()


def _on_redis(pg_url: str, server: PrivateRedis, hop_policy: HopPolicy) -> Settings:
    return fault_settings(
        pg_url,
        hop_policy,
        redis_url=f"{server.url}/0",
        broker_url=f"{server.url}/1",
        agent="tasks.agent",
        lock_timeout=3.0,
    )


def test_flushall_mid_run_then_restart_and_sweep(
    pg_url: str, private_redis: PrivateRedis, tmp_path: Path, hop_policy: HopPolicy
) -> None:
    settings = _on_redis(pg_url, private_redis, hop_policy)
    with running(settings, tmp_path) as (client, pool):
        sessions = [uid("s") for _ in range(10)]
        sent = send_waves(client, sessions, waves=3)
        time.sleep(0.3)
        private_redis.flushall()  # queued tasks, locks and cache: all gone
        pool.stop()
        pool.procs.clear()
        pool.start()  # a restarted worker declares its queue again
        wait_all_idle(client, sessions, timeout=120)
        assert assert_answered_exactly_once(client, sent) == 30


def test_redis_down_then_back_work_continues(
    pg_url: str, private_redis: PrivateRedis, tmp_path: Path, hop_policy: HopPolicy
) -> None:
    settings = _on_redis(pg_url, private_redis, hop_policy)
    with running(settings, tmp_path) as (client, _pool):
        sessions = [uid("s") for _ in range(10)]
        sent = send_waves(client, sessions, waves=2)
        time.sleep(0.2)
        private_redis.stop()
        # While Redis is down, messages are still accepted: they are durable in Postgres.
        for i, session_id in enumerate(sessions):
            text = f"what is 9*{i + 20}?"
            client.send_message(session_id, text, user_id=_owner(client, session_id))
            sent[session_id].append(text)
        time.sleep(2.0)
        private_redis.start()  # empty: no persistence, like the shared server
        wait_all_idle(client, sessions, timeout=180)
        assert assert_answered_exactly_once(client, sent) == 30


def _owner(client: AgentClient, session_id: str) -> str:
    snap = client.sessions.load_from_database(session_id)
    assert snap is not None
    return snap.user_id


def test_postgres_restarted_mid_run(
    private_pg: PrivatePostgres, tmp_path: Path, hop_policy: HopPolicy
) -> None:
    upgrade_schema(get_engine(private_pg.url))
    settings = fault_settings(private_pg.url, hop_policy, agent="tasks.agent", lock_timeout=3.0)
    try:
        with running(settings, tmp_path) as (client, _pool):
            sessions = [uid("s") for _ in range(10)]
            sent = send_waves(client, sessions, waves=3)
            time.sleep(0.3)
            private_pg.restart()  # every pooled connection dies
            wait_all_idle(client, sessions, timeout=180)
            assert assert_answered_exactly_once(client, sent) == 30
    finally:
        get_engine(private_pg.url).dispose()


def test_lost_commit_acknowledgements_never_apply_a_change_twice(
    pg_url: str, tmp_path: Path, hop_policy: HopPolicy
) -> None:
    port = int(PG_URL.rsplit(":", 1)[1].split("/")[0])
    dropper = CommitDropper(port, probability=0.15)
    # Workers reach Postgres through the proxy; the client and beat go direct.
    proxied = fault_settings(
        pg_url.replace(f":{port}/", f":{dropper.port}/"),
        hop_policy,
        agent="tasks.agent",
        lock_timeout=3.0,
        redis_url=REDIS_URL,
        broker_url=BROKER_URL,
    )
    direct = proxied.model_copy(update={"database_url": pg_url})
    pool = Workers(proxied, tmp_path, count=2).start()
    beat = Beat(direct, tmp_path).start()
    try:
        client = AgentClient(direct)
        sessions = [uid("s") for _ in range(6)]
        sent = send_waves(client, sessions, waves=4)
        run = uid("run")
        steps = [
            {
                "step_id": f"c{i}",
                "action": "count",
                "inputs": {"name": f"c{i}"},
                "dependencies": [] if i < 5 else [f"c{i - 5}"],
            }
            for i in range(30)
        ]
        workflow_id = client.start_workflow({"context": {"run": run}, "steps": steps})
        wait_all_idle(client, sessions, timeout=180)
        doc = client.wait_for_workflow(workflow_id, timeout=180)
        assert assert_answered_exactly_once(client, sent) == 24
        assert doc["status"] == "success"
        outputs = {sid: s["outputs"]["value"] for sid, s in doc["steps"].items()}
        assert outputs == {f"c{i}": 1 + i // 5 for i in range(30)}  # a chain of sums
        assert dropper.dropped > 0, "the proxy never dropped an acknowledgement"
        print(f"\n{dropper.dropped} of {dropper.commits} commit acknowledgements dropped")
        effects = redis.Redis.from_url(proxied.redis_url, decode_responses=True)
        assert set(effects.hgetall(effects_key(run))) == {f"c{i}" for i in range(30)}
    finally:
        beat.stop()
        pool.stop()
        dropper.close()
