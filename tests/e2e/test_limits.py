"""No input costs more than its share, and reads are scoped: paged histories, bounded
user state and workflow specs, unreadable cache entries, reads by another user."""

from __future__ import annotations

import time

import pytest
import redis

from config import Settings
from state.storage import keys
from tasks.client import AgentClient
from tests.support import Workers, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


@pytest.mark.parametrize(
    "plant",
    [["HSET", "rev", "garbage", "doc", "{}"], ["SET", "garbage"]],
    ids=["non-numeric-revision", "wrong-type"],
)
def test_an_unreadable_cache_entry_costs_no_lock_wait(
    client: AgentClient, worker_settings: Settings, plant: list[str]
) -> None:
    session_id, user = uid("s"), uid("u")
    r = redis.Redis.from_url(worker_settings.redis_url)
    r.execute_command(plant[0], keys.session_cache(session_id), *plant[1:])
    started = time.monotonic()
    client.send_message(session_id, "what is 2+2?", user_id=user)
    # Each phase used to wait out the lock TTL (30 s here): well under one TTL in all.
    doc = client.wait_for_idle(session_id, timeout=worker_settings.lock_timeout / 3)
    assert doc["message_history"][-1]["content"] == "2+2 = 4"
    assert time.monotonic() - started < worker_settings.lock_timeout / 3
    assert not r.exists(keys.session_lock(session_id))
