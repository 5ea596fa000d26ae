"""Load held: a burst of messages far beyond what the workers drain, then the reckoning.

Every session gets its messages as fast as the client can send them (four threads, each
sending message 1 of each of its sessions, then message 2, ...). Once every message is
answered we read back, from the database: how many replies each message got, each
message's latency (accepted -> replied), and how far any message fell behind messages
that could only run after it (a message can run once it is accepted and its session's
previous message is answered); and we compare the workers' memory and the broker's Redis
memory before, during and after the burst.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import text

from bench import harness
from config import Settings
from state.storage.db import get_engine
from tasks.client import AgentClient
from tasks.worker.processes import WorkerGroup

DRAIN_TIMEOUT_S = 3600.0
SENDERS = 4  # client threads: one alone sends too slowly for a burst on a small machine


@dataclass
class LoadResult:
    """What one burst showed."""

    messages: int
    answered_once: int  # messages with exactly one reply
    extra_replies: int  # replies beyond the first, over all messages
    send_rate: float  # messages/s the client got accepted
    drain_rate: float  # messages/s answered, from the first send to the last reply
    latencies: list[float]  # seconds, accepted -> replied, per message
    left_behind: list[float]  # per message: answered how long after a later-ready one
    session_finish_spread: float  # seconds between the first and last session done
    rss_before_kib: int
    rss_peak_kib: int
    rss_half_kib: int  # when half the messages were answered
    rss_after_kib: int
    broker_before: int  # bytes of the broker's keys
    broker_after: int
    cache_after: int  # bytes of the cache DB's keys after the burst
    sessions: int

    @property
    def exactly_once(self) -> bool:
        return self.answered_once == self.messages and self.extra_replies == 0


def keyspace_bytes(url: str) -> int:
    """Bytes of every key in one Redis DB index (MEMORY USAGE, summed)."""
    client = redis.Redis.from_url(url)
    return sum(int(client.memory_usage(key) or 0) for key in client.scan_iter(count=1000))


def burst(settings: Settings, group: WorkerGroup, sessions: int, per_session: int) -> LoadResult:
    """Send ``sessions`` x ``per_session`` messages at once; measure until all answered."""
    client = AgentClient(settings)
    warm = [f"loadwarm-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    for session_id in warm:
        client.send_message(session_id, "hello", user_id="bench-user")
    harness.wait_until(lambda: harness.answered(warm) >= 4, 120, "warm-up turns")
    rss_before = harness.rss_kib(group.pids())
    broker_before = keyspace_bytes(harness.BROKER_URL)
    prefix = f"load-{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{i}" for i in range(sessions)]
    total = sessions * per_session
    senders = [AgentClient(settings) for _ in range(SENDERS)]
    harness.analyze()
    started = time.perf_counter()
    with ThreadPoolExecutor(SENDERS) as pool:
        list(
            pool.map(
                _send, senders, [ids[j::SENDERS] for j in range(SENDERS)], [per_session] * SENDERS
            )
        )
    sent = time.perf_counter() - started
    harness.say(f"{total:,} messages accepted in {sent:.1f}s; draining")
    peak, half = _wait_draining(group, ids, total)
    time.sleep(2.0)  # let the workers finish acknowledging and settle
    result = _reckon(prefix)
    return LoadResult(
        messages=total,
        answered_once=result["once"],
        extra_replies=result["extra"],
        send_rate=total / sent,
        drain_rate=total / result["span"],
        latencies=result["latencies"],
        left_behind=result["left_behind"],
        session_finish_spread=result["spread"],
        rss_before_kib=rss_before,
        rss_peak_kib=max(peak, rss_before),
        rss_half_kib=half,
        rss_after_kib=harness.rss_kib(group.pids()),
        broker_before=broker_before,
        broker_after=keyspace_bytes(harness.BROKER_URL),
        cache_after=keyspace_bytes(harness.REDIS_URL),
        sessions=sessions,
    )


def _send(client: AgentClient, ids: list[str], per_session: int) -> None:
    for k in range(per_session):
        for session_id in ids:
            client.send_message(session_id, f"hello number {k}", user_id="bench-user")


def _wait_draining(group: WorkerGroup, ids: list[str], total: int) -> tuple[int, int]:
    """Wait until every message is answered; the workers' RSS (KiB): peak, half-way."""
    peak = half = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (answered := harness.answered(ids)) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{total} messages not answered within {DRAIN_TIMEOUT_S:g}s")
        rss = harness.rss_kib(group.pids())
        peak = max(peak, rss)
        if not half and answered >= total // 2:
            half = rss
        time.sleep(1.0)  # a poll looks up 2,000 sessions: keep it off the workers' backs
    return peak, half or harness.rss_kib(group.pids())


def _reckon(prefix: str) -> dict[str, Any]:
    """Replies per message, latencies, how far messages fell behind, session spread."""
    like = {"p": f"{prefix}-%"}
    with get_engine(harness.DATABASE_URL).connect() as conn:
        accepted = {
            row.message_id: (row.session_id, row.created_at)
            for row in conn.execute(
                text(
                    "SELECT message_id, session_id, created_at FROM inbox "
                    "WHERE session_id LIKE :p ORDER BY session_id, seq"
                ),
                like,
            )
        }
        replies = list(
            conn.execute(
                text(
                    "SELECT metadata->>'reply_to' AS reply_to, timestamp FROM messages "
                    "WHERE role = 'assistant' AND session_id LIKE :p"
                ),
                like,
            )
        )
    counts = Counter(row.reply_to for row in replies)
    replied: dict[str, datetime] = {}
    for row in replies:
        stamp = datetime.fromisoformat(row.timestamp)
        if row.reply_to not in replied or stamp < replied[row.reply_to]:
            replied[row.reply_to] = stamp
    first_sent = min(sent for _, sent in accepted.values())
    done = [m for m in accepted if m in replied]
    latencies = [(replied[m] - accepted[m][1]).total_seconds() for m in done]
    ready = _ready_times(accepted, replied)
    by_ready = sorted(done, key=lambda m: ready[m])
    return {
        "once": sum(1 for m in accepted if counts[m] == 1),
        "extra": sum(c - 1 for m, c in counts.items() if m in accepted and c > 1),
        "span": (max(replied.values()) - first_sent).total_seconds(),
        "latencies": latencies,
        "left_behind": _left_behind([replied[m] for m in by_ready]),
        "spread": _session_spread(done, accepted, replied),
    }


def _ready_times(
    accepted: dict[str, tuple[str, datetime]], replied: dict[str, datetime]
) -> dict[str, datetime]:
    """When each message could run: once it was accepted and its session's previous
    message was answered (``accepted`` is in session, then arrival, order)."""
    ready: dict[str, datetime] = {}
    previous: tuple[str, datetime] | None = None
    for m, (session_id, sent) in accepted.items():
        at = sent
        if previous is not None and previous[0] == session_id:
            at = max(sent, previous[1])
        ready[m] = at
        previous = (session_id, replied.get(m, at))
    return ready


def _left_behind(replies_in_ready_order: list[datetime]) -> list[float]:
    """Per message: how long it was still unanswered after the reply to a message that
    could only run later than it (0 if none overtook it)."""
    behind = []
    earliest_later: datetime | None = None
    for replied in reversed(replies_in_ready_order):
        lag = 0.0 if earliest_later is None else (replied - earliest_later).total_seconds()
        behind.append(max(0.0, lag))
        earliest_later = replied if earliest_later is None else min(earliest_later, replied)
    return behind


def _session_spread(
    done: list[str],
    accepted: dict[str, tuple[str, datetime]],
    replied: dict[str, datetime],
) -> float:
    finished: dict[str, datetime] = {}
    for m in done:
        session_id = accepted[m][0]
        finished[session_id] = max(finished.get(session_id, replied[m]), replied[m])
    values = sorted(finished.values())
    return (values[-1] - values[0]).total_seconds() if values else 0.0
