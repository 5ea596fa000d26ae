"""Benchmarks of the event log: the push's latency, its cost to turn throughput, and the
bytes a turn stores in ``events`` and ``revisions``.

- push latency: from a commit (the event's ``at``, stamped just before its statement) to
  a follower of ``AgentClient.events(follow=True)`` in another process holding the event,
  vs a plain Redis PUBLISH -> subscriber (another process), vs a Postgres NOTIFY ->
  LISTEN round trip (the alternative we did not take);
- turn throughput with the push on vs off (``AGENTSTATE_EVENTS``; the log itself is
  always written), and, when ``BENCH_BASE_PYTHONPATH`` names a checkout from before the
  event log, vs workers running that code (the whole cost of the log). Each pair of
  worker groups runs side by side, loaded at the same time, so that what else a shared
  machine does falls on both; the in-process cost of a turn (``bench/turn_cost.py``)
  says the same without a broker;
- bytes per turn: the growth of ``events`` and ``revisions`` (indexes included) per
  turn, vs that of ``messages`` (the history rows a turn writes anyway).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2
import redis

from bench import harness
from bench.harness import say
from bench.rows import Row, send_turns
from bench.suite import SHAPE, sized
from config import Settings
from state.storage.db import get_engine
from tasks.client import AgentClient
from tasks.worker.processes import WorkerGroup

ROUNDS = int(os.environ.get("BENCH_EVENT_ROUNDS", "3"))


# -- push latency --------------------------------------------------------------------


def _follow(settings: Settings, session_id: str, after: int, turns: int, out: Any) -> None:
    """(In a process of its own.) Follow the session; put each phase commit's latency."""
    from datetime import datetime

    client = AgentClient(settings)
    ends, latencies = 0, []
    out.put("ready")
    for event in client.events(session_id, after=after, follow=True, timeout=300):
        if event["kind"] != "phase_committed":
            continue
        latencies.append(time.time() - datetime.fromisoformat(event["at"]).timestamp())
        ends += event["phase"] == "idle"
        if ends == turns:
            break
    out.put(latencies)


def follower_latencies(settings: Settings, turns: int) -> list[float]:
    """Seconds from each committed phase's ``at`` to a follower (another process)
    holding its event."""
    client = AgentClient(settings)
    session_id = f"push-{uuid.uuid4().hex[:8]}"
    client.send_message(session_id, "hello", user_id="bench-user")
    client.wait_for_idle(session_id, timeout=60)
    start = list(client.events(session_id))[-1]["seq"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    follower = ctx.Process(target=_follow, args=(settings, session_id, start, turns, out))
    follower.start()
    out.get(timeout=60)
    harness.analyze()
    time.sleep(0.5)  # subscribed before the first message
    for n in range(turns):
        client.send_message(session_id, f"hello number {n}", user_id="bench-user")
        harness.wait_until(lambda n=n: harness.answered([session_id]) > n + 1, 60, "a turn")
    latencies: list[float] = out.get(timeout=120)
    follower.join(10)
    return latencies


def _subscribe(url: str, channel: str, count: int, out: Any) -> None:
    """(In a process of its own.) Put the latency of ``count`` messages on ``channel``."""
    pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1.0)
    out.put("ready")
    latencies = []
    while len(latencies) < count:
        message = pubsub.get_message(timeout=5.0)
        if message is not None:
            latencies.append(time.time() - float(message["data"]))
    out.put(latencies)


def redis_round_trips(count: int) -> list[float]:
    """Seconds from PUBLISH to a subscriber (another process) holding the message."""
    client = redis.Redis.from_url(harness.REDIS_URL)
    channel = f"bench:push:{uuid.uuid4().hex}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # The URL is passed: a spawned process does not see harness.configure's changes.
    subscriber = ctx.Process(target=_subscribe, args=(harness.REDIS_URL, channel, count, out))
    subscriber.start()
    out.get(timeout=60)
    for _ in range(count):
        client.publish(channel, str(time.time()))
        time.sleep(0.01)
    latencies: list[float] = out.get(timeout=60)
    subscriber.join(10)
    return latencies


def _listen(dsn: str, channel: str, count: int, out: Any) -> None:
    """(In a process of its own.) Put the latency of ``count`` notifications."""
    listener = psycopg2.connect(dsn)
    listener.autocommit = True
    listener.cursor().execute(f"LISTEN {channel}")
    out.put("ready")
    latencies: list[float] = []
    while len(latencies) < count:
        select.select([listener], [], [], 5.0)
        listener.poll()
        while listener.notifies:
            note = listener.notifies.pop(0)
            latencies.append(time.time() - float(note.payload))
    listener.close()
    out.put(latencies)


def notify_round_trips(count: int) -> list[float]:
    """Seconds from a committed NOTIFY to a LISTENing process holding it."""
    dsn = harness.DATABASE_URL.replace("postgresql+psycopg2", "postgresql")
    channel = f"bench_{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    listener = ctx.Process(target=_listen, args=(dsn, channel, count, out))
    listener.start()
    out.get(timeout=60)
    sender = psycopg2.connect(dsn)
    sender.autocommit = True
    for _ in range(count):
        sender.cursor().execute("SELECT pg_notify(%s, %s)", (channel, str(time.time())))
        time.sleep(0.01)
    latencies: list[float] = out.get(timeout=60)
    sender.close()
    listener.join(10)
    return latencies


def push(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Commit -> follower, p50 / p95, vs a plain Redis pub/sub round trip."""
    turns = sized(40, scale, 3)
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        ours = follower_latencies(settings, turns)
    plain = redis_round_trips(len(ours))
    listen = notify_round_trips(len(ours))
    for p in (50, 95):
        table.append(
            Row(
                f"push latency p{p} (commit -> follower)",
                harness.percentile(ours, p) * 1000,
                harness.percentile(plain, p) * 1000,
                "ms",
                "plain Redis PUBLISH -> subscriber",
                higher_is_better=False,
            )
        )
    notes.append(
        f"push: {len(ours)} phase commits followed; commit -> follower is the commit itself "
        "(`at` is stamped before its statement), the publish after it, the follower's wake "
        "and its read of the log. Postgres NOTIFY -> LISTEN round trip: "
        f"p50 {harness.percentile(listen, 50) * 1000:.2f} ms, "
        f"p95 {harness.percentile(listen, 95) * 1000:.2f} ms (not taken: a LISTEN "
        "connection per follower, and NOTIFY serializes committing transactions)."
    )


# -- throughput ----------------------------------------------------------------------


@contextmanager
def workers_from(settings: Settings, pythonpath: str) -> Iterator[WorkerGroup]:
    """``harness.workers`` running the code at ``pythonpath`` (another checkout)."""
    group = WorkerGroup(
        settings,
        Path(tempfile.mkdtemp(prefix="agentstate-bench-")),
        **SHAPE,
        cwd=Path(pythonpath),
        loglevel="WARNING",
    )
    group.env["PYTHONPATH"] = pythonpath
    group.start()
    try:
        yield group
    finally:
        group.stop()


def _runner(settings: Settings, code: str | None) -> Any:
    return workers_from(settings, code) if code else harness.workers(settings, **SHAPE)


def _paired(groups: list[tuple[Settings, str | None]], sessions: int, per: int) -> list[float]:
    """Turns/s of two worker groups (each running the code at its path, or this
    checkout's) loaded at the same time: what else the machine does falls on both."""
    (first, first_code), (second, second_code) = groups
    with _runner(first, first_code), _runner(second, second_code):
        clients = [AgentClient(first), AgentClient(second)]
        for client in clients:
            send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
        rates = [0.0, 0.0]

        def load(index: int) -> None:
            prefix = f"ev{index}-{uuid.uuid4().hex[:6]}"
            rates[index] = send_turns(clients[index], prefix, sessions, per)

        threads = [threading.Thread(target=load, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return rates


def throughput(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s with the push on vs off, and (with BENCH_BASE_PYTHONPATH) vs the code
    before the log; each pair runs side by side, in several rounds."""
    sessions, per = sized(50, scale, 4), sized(4, scale, 1)
    rounds = sized(ROUNDS, scale, 1)
    base = os.environ.get("BENCH_BASE_PYTHONPATH")
    pairs = [("push off (AGENTSTATE_EVENTS=false)", {"events": False}, None)]
    if base:
        pairs.append(("the code before the event log", {}, base))
    for label, options, code in pairs:
        ours, theirs = [], []
        for round_ in range(rounds):
            mine = (harness.bench_settings(), None)
            other = (harness.bench_settings(**options), code)
            # Sides swap every round: an A/A run (the same code on both sides) showed the
            # first side about 3% slower.
            if round_ % 2 == 0:
                first, second = _paired([mine, other], sessions, per)
            else:
                second, first = _paired([other, mine], sessions, per)
            ours.append(first)
            theirs.append(second)
        say(f"side by side with {label}: ours {ours}, theirs {theirs}")
        table.append(
            Row(
                f"turns/s every_phase, event log + push vs {label.split(' (')[0]}",
                statistics.mean(ours),
                statistics.mean(theirs),
                "turns/s",
                f"{label}, side by side",
                target=">= 0.95x",
            )
        )


def in_process_cost(pythonpath: str, turns: int, *flags: str) -> tuple[float, float]:
    """(worker's, client's) ms per turn of ``bench/turn_cost.py`` run with the code at
    ``pythonpath``: the phases, and accepting the message."""
    script = str(harness.REPO / "bench" / "turn_cost.py")
    env = {**os.environ, "PYTHONPATH": pythonpath}
    command = [sys.executable, script, harness.DATABASE_URL, harness.REDIS_URL, str(turns)]
    done = subprocess.run([*command, *flags], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    accept = float(found["accept_ms_per_turn"])
    return float(found["ms_per_turn"]) - accept, accept


def turn_cost(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """In-process ms per turn (no broker): with the log and push, push off, and (with
    BENCH_BASE_PYTHONPATH) the code before the log. Best of interleaved runs: the least
    disturbed by the other users of a shared machine."""
    turns, rounds = sized(150, scale, 10), sized(8, scale, 1)
    here = str(harness.REPO)
    base = os.environ.get("BENCH_BASE_PYTHONPATH")
    runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": [], "base": []}
    for _ in range(rounds):
        runs["on"].append(in_process_cost(here, turns))
        runs["off"].append(in_process_cost(here, turns, "--no-push"))
        if base:
            runs["base"].append(in_process_cost(base, turns))
    say(f"(phases, accept) ms per turn in-process: {runs}")
    best = {
        name: (min(r[0] for r in found), min(r[1] for r in found))
        for name, found in runs.items()
        if found
    }
    table.append(
        Row(
            "turn in-process: phases, event push on vs off",
            best["on"][0],
            best["off"][0],
            "ms",
            "push off",
            higher_is_better=False,
        )
    )
    if "base" in best:
        for part, index in (("phases (worker)", 0), ("accepting the message (client)", 1)):
            table.append(
                Row(
                    f"turn in-process: {part}, event log + push vs no log",
                    best["on"][index],
                    best["base"][index],
                    "ms",
                    "the code before the event log",
                    higher_is_better=False,
                )
            )


# -- storage -------------------------------------------------------------------------


def _sizes() -> dict[str, int]:
    with get_engine(harness.DATABASE_URL).connect() as conn:
        return {
            table: int(
                conn.exec_driver_sql(f"SELECT pg_total_relation_size('{table}')").scalar_one()
            )
            for table in ("events", "revisions", "messages", "sessions", "inbox")
        }


def _row_bytes() -> dict[str, float]:
    with get_engine(harness.DATABASE_URL).connect() as conn:
        return {
            table: float(
                conn.exec_driver_sql(
                    f"SELECT coalesce(avg(pg_column_size(t.*)), 0) FROM {table} t"
                ).scalar_one()
            )
            for table in ("events", "revisions", "messages")
        }


def storage(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Bytes a turn adds to events + revisions vs to messages (indexes included)."""
    sessions, per = sized(50, scale, 4), sized(40, scale, 2)
    turns = sessions * per
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        client = AgentClient(settings)
        before = _sizes()
        send_turns(client, f"bytes-{uuid.uuid4().hex[:6]}", sessions, per)
        after = _sizes()
    grew = {name: (after[name] - before[name]) / turns for name in after}
    rows = _row_bytes()
    table.append(
        Row(
            "bytes stored per turn (events + revisions)",
            grew["events"] + grew["revisions"],
            grew["messages"],
            "B",
            "messages (the history rows)",
            higher_is_better=False,
        )
    )
    notes.append(
        f"bytes per turn ({turns} turns, indexes included): events {grew['events']:.0f}, "
        f"revisions {grew['revisions']:.0f}, messages {grew['messages']:.0f}, inbox "
        f"{grew['inbox']:.0f}; average row: event {rows['events']:.0f} B, revision "
        f"{rows['revisions']:.0f} B, message {rows['messages']:.0f} B."
    )
