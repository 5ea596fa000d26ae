"""Token streaming through real workers: chunks reach followers as a handler produces them
(before its phase commits), once each and in order, a follower that starts mid-answer
catching up first; the durable log is the same with or without them; a failed or
cancelled phase's chunks are followed by the event that says so; a flushed Redis loses
chunks, never events.

The workers' Redis (cache, locks, pushes, chunks) is a private redis-server, so that
FLUSHALL here is a real one. The test agent (tests.agents) streams "trickle" replies in
TRICKLE_CHUNKS chunks, TRICKLE_PAUSE_S apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis

from config import Settings
from state.storage import keys
from tasks.client import AgentClient
from tests.agents import TRICKLE_CHUNKS, quiet_key
from tests.services import PrivateRedis
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers
TRICKLED = "".join(f"part {n} " for n in range(1, TRICKLE_CHUNKS + 1))


@pytest.fixture(scope="module")
def stream_settings(pg_url: str, private_redis: PrivateRedis) -> Settings:
    return agent_test_settings(pg_url, redis_url=f"{private_redis.url}/0")


@pytest.fixture(scope="module")
def client(
    stream_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(stream_settings, tmp_path_factory.mktemp("streaming"), count=2).start()
    yield AgentClient(stream_settings)
    pool.stop()


def follow(client: AgentClient, session_id: str, after: int = 0) -> list[dict[str, Any]]:
    """Everything a token follower gets until the turn's reply, each with when it came."""
    items = []
    for item in client.events(session_id, after=after, follow=True, timeout=60, tokens=True):
        items.append({**item, "received": time.time()})
        if item["kind"] == "reply":
            break
    return items


def chunks_of(items: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(i["data"]["n"], i["data"]["text"]) for i in items if i["kind"] == "token"]


def stored_chunks(client: AgentClient, session_id: str) -> int:
    return int(client.backend.redis.llen(keys.session_chunks(session_id)))


def wait_until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def without_tokens(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in i.items() if k != "received"} for i in items if i["seq"]]


def test_chunks_arrive_before_the_reply_commits_in_order_once(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    after = list(client.events(session_id))[-1]["seq"]
    client.send_message(session_id, "trickle please", user_id=user)
    items = follow(client, session_id, after)

    assert chunks_of(items) == [(n, f"part {n} ") for n in range(1, TRICKLE_CHUNKS + 1)]
    reply = items[-1]
    assert reply["kind"] == "reply" and reply["data"]["text"] == TRICKLED
    message_id = reply["data"]["message_id"]
    assert {i["data"]["message_id"] for i in items if i["kind"] == "token"} == {message_id}
    # The first chunk came before generating committed, and long before the reply's
    # commit time (it was streamed TRICKLE_CHUNKS - 1 pauses earlier).
    kinds = [i["kind"] for i in items]
    first = kinds.index("token")
    assert (
        items[first - 1]["kind"] == "phase_committed" and items[first - 1]["phase"] == "generating"
    )
    assert kinds[first:] == ["token"] * TRICKLE_CHUNKS + ["reply"]  # generating's own commit
    assert items[first]["received"] < datetime.fromisoformat(reply["at"]).timestamp()
    # The durable part is exactly the log.
    assert without_tokens(items) == list(client.events(session_id, after=after))[:-1]


def test_late_followers_get_chunks_one_to_n_once_in_order(client: AgentClient) -> None:
    """Followers that start at different moments mid-answer, racing the chunks being
    streamed, each get every chunk once, in order."""
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "trickle for the latecomers", user_id=user)
    results: dict[int, list[dict[str, Any]]] = {}
    threads = []
    for index, at_least in enumerate((1, 3, 3, 5, 8, 10)):
        wait_until(lambda need=at_least: stored_chunks(client, session_id) >= need)

        def run(slot: int = index) -> None:
            results[slot] = follow(AgentClient(client.settings), session_id)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(60)
    assert len(results) == len(threads)
    for items in results.values():
        assert chunks_of(items) == [(n, f"part {n} ") for n in range(1, TRICKLE_CHUNKS + 1)]
        assert items[-1]["data"]["text"] == TRICKLED


def test_the_durable_log_is_the_same_with_streaming_on_and_off(client: AgentClient) -> None:
    streamed, quiet, user = uid("s"), uid("s"), uid("u")
    client.backend.redis.set(quiet_key(quiet), "1")
    logs = []
    for session_id in (streamed, quiet):
        client.send_message(session_id, "what is 6*7?", user_id=user)
        items = follow(client, session_id)
        client.wait_for_idle(session_id, timeout=30)
        logs.append((items, list(client.events(session_id))))
    (streamed_items, streamed_log), (quiet_items, quiet_log) = logs
    assert [c for _, c in chunks_of(streamed_items)] == ["6*7 ", "= ", "42"]
    assert chunks_of(quiet_items) == []

    def shape(log: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (e["seq"], e["kind"], e["revision"], e["phase"], e["data"].get("text")) for e in log
        ]

    assert shape(streamed_log) == shape(quiet_log)
    assert streamed_log[-2]["data"]["text"] == "6*7 = 42"


def test_a_failed_phases_chunks_are_followed_by_the_event_that_says_so(
    client: AgentClient,
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "trickle then fumble", user_id=user)
    items = follow(client, session_id)
    kinds = [i["kind"] for i in items]
    assert len(chunks_of(items)) == TRICKLE_CHUNKS
    failed = kinds.index("turn_failed")
    assert "token" not in kinds[failed:]
    assert items[-1]["data"]["kind"] == "apology"


def test_a_cancelled_turns_chunks_stop_at_the_event_that_says_so(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "trickle but stall", user_id=user)
    wait_until(lambda: stored_chunks(client, session_id) >= TRICKLE_CHUNKS // 2)
    items: list[dict[str, Any]] = []
    # Long enough for the handler to stream the rest of its chunks after the cancel.
    for item in client.events(session_id, follow=True, timeout=6, tokens=True):
        items.append(item)
        if item["kind"] == "token" and item["data"]["n"] == TRICKLE_CHUNKS // 2:
            assert client.cancel_turn(session_id) is True
    kinds = [i["kind"] for i in items]
    # The handler went on streaming after the cancel; none of that reached the follower.
    assert stored_chunks(client, session_id) == TRICKLE_CHUNKS
    cancelled = kinds.index("turn_cancelled")
    assert "token" not in kinds[cancelled:]
    assert chunks_of(items) == [(n, f"part {n} ") for n in range(1, TRICKLE_CHUNKS // 2 + 1)]
    assert items[cancelled + 1]["kind"] == "reply"
    assert items[cancelled + 1]["data"]["kind"] == "cancelled"


def test_redis_flushed_mid_stream_loses_only_chunks(
    client: AgentClient, private_redis: PrivateRedis
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "trickle through a flush", user_id=user)
    wait_until(lambda: stored_chunks(client, session_id) >= 3)
    items: list[dict[str, Any]] = []
    for item in client.events(session_id, follow=True, timeout=60, tokens=True):
        items.append(item)
        if item["kind"] == "token" and item["data"]["n"] == 4:
            redis.Redis.from_url(private_redis.url).flushall()
        if item["kind"] == "reply":
            break
    client.wait_for_idle(session_id, timeout=30)
    assert [i for i in items if i["seq"]] == list(client.events(session_id))[:-1]
    assert items[-1]["data"]["text"] == TRICKLED
    numbers = [n for n, _ in chunks_of(items)]
    assert numbers[:4] == [1, 2, 3, 4] and numbers == sorted(set(numbers))
