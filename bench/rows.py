"""Each measurement: ours and its baseline, run side by side in one process tree."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update

from bench import harness, warm
from bench.harness import say
from bench.warm import Prepared
from config import Settings
from state.session import make_message
from state.sessions.snapshot import InboxState
from state.storage.db import get_engine
from state.storage.tables import inbox, messages, sessions
from tasks.client import AgentClient
from tasks.worker.processes import Flower, free_port

TARGET = re.compile(r"^(>=|<=)\s*([0-9.]+)x")


@dataclass
class Row:
    """One line of the table: ours vs a baseline, their ratio, and the target it meets.

    ``target`` is a ratio bound (``">= 0.9x"``, ``"<= 1.2x"``, judged from the ratio) or
    words (``"report"``); ``check`` judges a row whose verdict is not a ratio.
    """

    name: str
    ours: float
    baseline: float
    unit: str
    baseline_name: str
    higher_is_better: bool = True
    target: str = ""
    check: bool | None = None

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else float("nan")

    @property
    def verdict(self) -> str:
        """``met``, ``missed``, or empty for a row reported without a target."""
        if self.check is not None:
            return "met" if self.check else "missed"
        match = TARGET.match(self.target)
        if match is None:
            return ""
        bound = float(match.group(2))
        met = self.ratio >= bound if match.group(1) == ">=" else self.ratio <= bound
        return "met" if met else "missed"


# -- turns ---------------------------------------------------------------------------


def send_turns(client: AgentClient, prefix: str, sessions_n: int, per_session: int) -> float:
    """Send plain messages to ``sessions_n`` sessions; return turns/s until all answered."""
    ids = [f"{prefix}-{i}" for i in range(sessions_n)]
    total = sessions_n * per_session
    harness.analyze()
    started = time.perf_counter()
    for k in range(per_session):
        for session_id in ids:
            client.send_message(session_id, f"hello number {k}", user_id="bench-user")
    harness.wait_until(lambda: harness.answered(ids) >= total, 600, f"{total} turns")
    return total / (time.perf_counter() - started)


def turns_per_second(settings: Settings, sessions_n: int, per_session: int) -> float:
    client = AgentClient(settings)
    send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)  # imports, pools, caches
    return send_turns(client, f"tp-{uuid.uuid4().hex[:6]}", sessions_n, per_session)


class TurnProbe:
    """One session's turns, one at a time on an idle system: a sample per :meth:`once`.

    Latency runs from the message's acceptance (its inbox timestamp) to its reply's
    timestamp. With ``history``, the session first gets that many history items.
    """

    def __init__(self, settings: Settings, prefix: str = "lat", history: int = 0) -> None:
        self.client = AgentClient(settings)
        self.session_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.sent = 0
        self.skip = 2  # the first turns warm up
        self.grown = 0  # answered inbox rows grow_history added (no turn answered them)
        if history > 2:
            self.once()
            self.grown = grow_history(self.session_id, history - 2)
            self.skip += 1
        harness.analyze()

    def once(self) -> None:
        """One turn: send a message and wait for its reply."""
        self.client.send_message(self.session_id, f"hello number {self.sent}", user_id="bench-user")
        self.sent += 1
        answered = self.sent + self.grown
        harness.wait_until(lambda: harness.answered([self.session_id]) >= answered, 60, "a turn")

    def latencies(self) -> list[float]:
        """Seconds per turn, warm-up turns left out."""
        return _latencies_from_timestamps(self.session_id)[self.skip :]


def _latencies_from_timestamps(session_id: str) -> list[float]:
    engine = get_engine(harness.DATABASE_URL)
    with engine.connect() as conn:
        accepted = {
            row.message_id: row.created_at
            for row in conn.execute(select(inbox).where(inbox.c.session_id == session_id))
        }
    from state.sessions.store import SessionStore
    from state.storage.backend import Backend

    backend = Backend.build(harness.bench_settings())
    history = SessionStore.for_engine(backend.engine, backend.cache).history(session_id)
    latencies = []
    for item in history:
        reply_to = item["metadata"].get("reply_to")
        if item["role"] == "assistant" and reply_to in accepted:
            sent = accepted[reply_to]
            replied = datetime.fromisoformat(item["timestamp"])
            if sent.tzinfo is None:
                replied = replied.replace(tzinfo=None)
            latencies.append((replied - sent).total_seconds())
    return latencies


# -- history growth ------------------------------------------------------------------


def grow_history(session_id: str, extra: int) -> int:
    """Give a session ``extra`` more history items directly in the database, and the
    answered inbox messages a session gets them from (one per user message); return
    how many of those."""
    engine = get_engine(harness.DATABASE_URL)
    with engine.begin() as conn:
        count, inbox_seq = conn.execute(
            select(sessions.c.message_count, sessions.c.inbox_seq).where(
                sessions.c.session_id == session_id
            )
        ).one()
        answered = (extra + 1) // 2
        conn.execute(insert(inbox), _answered_inbox(session_id, inbox_seq, answered))
        rows = []
        for i in range(extra):
            item = make_message("user" if i % 2 == 0 else "assistant", f"old message {i}")
            rows.append(
                {
                    "session_id": session_id,
                    "seq": count + i,
                    "role": item["role"],
                    "content": item["content"],
                    "timestamp": item["timestamp"],
                    "metadata": item["metadata"],
                }
            )
        conn.execute(insert(messages), rows)
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(
                message_count=count + extra,
                inbox_seq=inbox_seq + answered,
                revision=sessions.c.revision + 1,
            )
        )
    return answered


def _answered_inbox(session_id: str, after_seq: int, count: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "message_id": f"old-{uuid.uuid4().hex}",
            "session_id": session_id,
            "seq": after_seq + 1 + i,
            "text": f"old message {2 * i}",
            "state": InboxState.ANSWERED.value,
            "created_at": now,
        }
        for i in range(count)
    ]


# -- workflows -----------------------------------------------------------------------


def layered_dag(layers: int = 10, width: int = 100, action: str = "echo") -> dict[str, Any]:
    steps = []
    for layer in range(layers):
        for i in range(width):
            deps = [] if layer == 0 else [f"L{layer - 1}-{i}", f"L{layer - 1}-{(i + 1) % width}"]
            steps.append(
                {
                    "step_id": f"L{layer}-{i}",
                    "action": action,
                    "inputs": {"i": i},
                    "dependencies": deps,
                }
            )
    return {"steps": steps}


def dag_seconds(
    settings: Settings, layers: int = 10, width: int = 100, action: str = "echo"
) -> float:
    """Seconds to run a layered DAG of ``layers`` x ``width`` steps of ``action`` (echo:
    quick, so each step commits once; bench.floor_tasks's claimed_echo: claimed first)."""
    client = AgentClient(settings)
    warm = client.start_workflow({"steps": [{"step_id": "w", "action": "echo"}]})
    client.wait_for_workflow(warm, timeout=60)
    spec = layered_dag(layers, width, action)
    started = time.perf_counter()
    workflow_id = client.start_workflow(spec)
    doc = client.wait_for_workflow(workflow_id, timeout=600)
    assert doc["status"] == "success"
    return time.perf_counter() - started


# -- the lock ------------------------------------------------------------------------


def prepare_ours_lock(settings: Settings, session_id: str, n: int) -> Prepared:
    """(In a process of ``bench.warm``.) ``n`` contended updates of one session, after
    one untimed update that opens the connections and loads the code."""
    from state.lock import DistributedStateSync

    sync = DistributedStateSync(settings=settings)
    sync.update_state_atomic(session_id, _bump)

    def run() -> None:
        for _ in range(n):
            sync.update_state_atomic(session_id, _bump)

    return run, _nothing


def _bump(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["n"] = doc["metadata"].get("n", 0) + 1
    return doc


def prepare_raw_lock(redis_url: str, key: str, n: int) -> Prepared:
    """(In a process of ``bench.warm``.) ``n`` increments, each under SET NX + a Lua
    release, after the connection is open and the script loaded."""
    import redis as redis_lib

    from state.storage.redis_client import RELEASE

    r = redis_lib.Redis.from_url(redis_url)
    release = r.register_script(RELEASE)
    token = uuid.uuid4().hex
    release(keys=[f"{key}:warm"], args=[token])  # loads the script, opens the connection

    def run() -> None:
        done = 0
        while done < n:
            if r.set(f"{key}:lock", token, nx=True, px=30000):
                r.incr(f"{key}:n")
                release(keys=[f"{key}:lock"], args=[token])
                done += 1
            else:
                time.sleep(0.001)

    return run, r.close


def _nothing() -> None:
    return None


def lock_rates(processes: int = 4, each: int = 250) -> tuple[float, float]:
    """Updates/s of ``processes`` processes contending for one lock: ours, then raw.
    Both are timed warm (``bench.warm``): process start-up and imports are not timed."""
    settings = harness.bench_settings()
    session_id = f"lock-{uuid.uuid4().hex[:6]}"
    key = f"bench:rawlock:{uuid.uuid4().hex}"
    ours = warm.run_warm("bench.rows:prepare_ours_lock", [(settings, session_id, each)] * processes)
    raw = warm.run_warm("bench.rows:prepare_raw_lock", [(harness.REDIS_URL, key, each)] * processes)
    return processes * each / ours, processes * each / raw


# -- statements ----------------------------------------------------------------------


def commit_micros(settings: dict[str, Settings], commits: int, rounds: int = 7) -> dict[str, float]:
    """Microseconds per one-statement phase commit on the Postgres session store, in
    this process, for each of ``settings`` (sent the way its ``db_pooler`` says). Rounds
    take turns between them, so that load from elsewhere hits each alike; the median
    round counts."""
    from state.sessions.snapshot import SessionChange, Snapshot
    from state.sessions.store import SessionStore
    from state.storage.backend import Backend

    stores: dict[str, tuple[SessionStore, Snapshot]] = {}
    for label, each in settings.items():
        backend = Backend.build(each)
        store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
        stores[label] = (store, store.create(f"commit-{uuid.uuid4().hex[:8]}", "bench-user"))
    results: dict[str, list[float]] = {label: [] for label in settings}
    for round_ in range(rounds + 1):  # the first round warms the pools (and prepares)
        for label, (store, first) in stores.items():
            snap = first
            started = time.perf_counter()
            for i in range(commits):
                phase = "planning" if i % 2 else "retrieving"
                change = SessionChange(phase=phase, status="active", doc=dict(snap.doc))
                snap = store.commit(snap, change).snapshot
            stores[label] = (store, snap)
            if round_:
                results[label].append((time.perf_counter() - started) / commits * 1e6)
    return {label: harness.median(values) for label, values in results.items()}


# -- Flower --------------------------------------------------------------------------


def with_flower(settings: Settings) -> Flower:
    """Flower attached to the broker (it consumes every task event)."""
    flower = Flower(settings, free_port(), cwd=harness.REPO)
    if not flower.wait_ready():
        raise RuntimeError("Flower did not come up")
    time.sleep(1.0)  # let it subscribe to events before the clock starts
    say("Flower attached")
    return flower
