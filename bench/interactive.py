"""The rows of interactive agents: how soon a follower sees the first chunk of an answer
and how fast chunks reach each follower, and the asyncio client's turns/s next to the
sync client's, on the same workers."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import redis

from bench import harness
from bench.harness import say
from bench.rows import Row, send_turns
from bench.stream_agent import CHUNK, CHUNKS
from bench.suite import SHAPE, rounds_of, sized, turns_of
from config import Settings
from tasks.client import AgentClient, AsyncAgentClient

FOLLOWERS = 4


def streaming(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Time to the first chunk of an answer (p50/p95) vs to its reply; chunks/s per
    follower, FOLLOWERS following one answer, vs raw Redis pub/sub."""
    count = sized(40, scale, 3)
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        first, reply = _first_chunk_times(settings, count)
    for p in (50, 95):
        table.append(
            Row(
                f"time to first chunk p{p}",
                harness.percentile(first, p) * 1000,
                harness.percentile(reply, p) * 1000,
                "ms",
                "time to the reply",
                higher_is_better=False,
            )
        )
    flood = harness.bench_settings(agent="bench.stream_agent")
    with harness.workers(flood, **SHAPE):
        rates = _chunk_rates(flood, FOLLOWERS)
    table.append(
        Row(
            f"chunks/s per follower ({FOLLOWERS} following)",
            harness.median(rates),
            _raw_pubsub_rate(CHUNKS),
            "chunks/s",
            "raw PUBLISH to a subscriber",
        )
    )
    notes.append(
        f"streaming: first chunk and reply as seen by a follower of each of {count} turns "
        f"(reference agent, 3 chunks a reply); chunks/s: {CHUNKS} chunks of "
        f"{len(CHUNK)} bytes streamed as fast as a handler can, the median follower."
    )


def _first_chunk_times(settings: Settings, count: int) -> tuple[list[float], list[float]]:
    client = AgentClient(settings)
    first, reply = [], []
    for n in range(count + 1):
        session_id = f"ttfc-{uuid.uuid4().hex[:8]}"
        client.send_message(session_id, "hello", user_id="bench-user")
        client.wait_for_idle(session_id, timeout=60)
        after = list(client.events(session_id))[-1]["seq"]
        seen: dict[str, float] = {}
        ready = threading.Event()

        def follow(
            session_id: str = session_id,
            after: int = after,
            seen: Any = seen,
            ready: threading.Event = ready,
        ) -> None:
            items = client.events(session_id, after, follow=True, timeout=60, tokens=True)
            ready.set()
            for item in items:
                if item["kind"] == "token":
                    seen.setdefault("first", time.perf_counter())
                if item["kind"] == "reply":
                    seen["reply"] = time.perf_counter()
                    return

        thread = threading.Thread(target=follow)
        thread.start()
        ready.wait(10)
        time.sleep(0.05)  # subscribed
        started = time.perf_counter()
        client.send_message(session_id, f"what is {n}+1?", user_id="bench-user")
        thread.join(60)
        if n > 0 and "first" in seen:  # the first turn warms up
            first.append(seen["first"] - started)
            reply.append(seen["reply"] - started)
    return first, reply


def _chunk_rates(settings: Settings, followers: int) -> list[float]:
    client = AgentClient(settings)
    session_id = f"flood-{uuid.uuid4().hex[:8]}"
    client.send_message(session_id, "hello", user_id="bench-user")
    client.wait_for_idle(session_id, timeout=60)
    after = list(client.events(session_id))[-1]["seq"]
    rates: list[float] = []
    ready = threading.Barrier(followers + 1)

    def follow() -> None:
        mine = AgentClient(settings)
        times = []
        items = mine.events(session_id, after, follow=True, timeout=120, tokens=True)
        ready.wait()
        for item in items:
            if item["kind"] == "token":
                times.append(time.perf_counter())
            if item["kind"] == "reply":
                break
        if len(times) > 1:
            rates.append((len(times) - 1) / (times[-1] - times[0]))

    threads = [threading.Thread(target=follow) for _ in range(followers)]
    for thread in threads:
        thread.start()
    ready.wait()
    time.sleep(0.2)  # every follower subscribed
    client.send_message(session_id, "stream to everyone", user_id="bench-user")
    for thread in threads:
        thread.join(120)
    return rates


def _raw_pubsub_rate(count: int) -> float:
    """Messages/s from a PUBLISH loop to one subscriber (the ceiling a follower shares)."""
    client = redis.Redis.from_url(harness.REDIS_URL)
    channel = f"bench-raw-{uuid.uuid4().hex[:6]}"
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1.0)
    got: list[float] = []

    def listen() -> None:
        while len(got) < count:
            if pubsub.get_message(timeout=5.0) is not None:
                got.append(time.perf_counter())

    thread = threading.Thread(target=listen)
    thread.start()
    for n in range(count):
        client.publish(channel, f"{n}\nmsg\n{CHUNK}")
    thread.join(30)
    pubsub.close()
    return (len(got) - 1) / (got[-1] - got[0]) if len(got) > 1 else float("nan")


def async_client(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s sent and awaited through AsyncAgentClient (one event loop) vs AgentClient
    (one thread), on the same workers."""
    sessions, per = turns_of(scale)
    best = {"async": 0.0, "sync": 0.0}
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        client = AgentClient(settings)
        send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
        asyncio.run(_async_turns(settings, "warm", 4, 2))
        for _ in range(rounds_of(scale)):
            best["sync"] = max(best["sync"], send_turns(client, _prefix(), sessions, per))
            measured = asyncio.run(_async_turns(settings, _prefix(), sessions, per))
            best["async"] = max(best["async"], measured)
            say(f"async {best['async']:.1f}, sync {best['sync']:.1f} turns/s")
    table.append(
        Row("turns/s AsyncAgentClient", best["async"], best["sync"], "turns/s", "AgentClient")
    )
    notes.append(
        f"async client: {sessions} sessions x {per} messages, each round's messages sent at "
        "once from one event loop, then the same completion poll; the sync client sends "
        "them one after another from one thread (bench.rows.send_turns)."
    )


def _prefix() -> str:
    return f"tp-{uuid.uuid4().hex[:6]}"


async def _async_turns(settings: Settings, prefix: str, sessions_n: int, per: int) -> float:
    async with AsyncAgentClient(settings) as client:
        ids = [f"{prefix}-{i}" for i in range(sessions_n)]
        total = sessions_n * per
        harness.analyze()
        started = time.perf_counter()
        for k in range(per):  # as send_turns sends, but every session's message at once
            await asyncio.gather(
                *(client.send_message(s, f"hello number {k}", user_id="bench-user") for s in ids)
            )
        # The same completion poll as the sync client's measurement.
        harness.wait_until(lambda: harness.answered(ids) >= total, 600, f"{total} turns")
        return total / (time.perf_counter() - started)
