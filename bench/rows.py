"""Each measurement: ours and its baseline, run side by side in one process tree."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import chain
from sqlalchemy import insert, select, update

from bench import harness
from bench.harness import say
from config import Settings
from state.session import make_message
from state.storage import keys
from state.storage.db import get_engine
from state.storage.tables import inbox, messages, sessions
from tasks.app import make_app
from tasks.client import AgentClient
from tasks.processes import Flower, free_port

HOPS = 6


@dataclass
class Row:
    """One line of the table: ours vs a baseline, and their ratio."""

    name: str
    ours: float
    baseline: float
    unit: str
    baseline_name: str
    higher_is_better: bool = True
    target: str = ""

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else float("nan")


# -- turns ---------------------------------------------------------------------------


def send_turns(client: AgentClient, prefix: str, sessions_n: int, per_session: int) -> float:
    """Send plain messages to ``sessions_n`` sessions; return turns/s until all answered."""
    ids = [f"{prefix}-{i}" for i in range(sessions_n)]
    total = sessions_n * per_session
    started = time.perf_counter()
    for k in range(per_session):
        for session_id in ids:
            client.send_message(session_id, f"hello number {k}", user_id="bench-user")
    harness.wait_until(lambda: harness.answered(prefix) >= total, 600, f"{total} turns")
    return total / (time.perf_counter() - started)


def turns_per_second(settings: Settings, sessions_n: int, per_session: int) -> float:
    client = AgentClient(settings)
    send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)  # imports, pools, caches
    return send_turns(client, f"tp-{uuid.uuid4().hex[:6]}", sessions_n, per_session)


def _chain(app: Any, key: str) -> Any:
    links = [
        app.signature("agentstate.baseline.noop", args=[None], immutable=True)
        for _ in range(HOPS - 1)
    ]
    links.append(app.signature("agentstate.baseline.noop", args=[key], immutable=True))
    return chain(*links)


def chains_per_second(settings: Settings, count: int) -> float:
    """Bare Celery: ``count`` chains of six no-op hops (Celery's own canvas)."""
    app = make_app(settings)
    warm = f"bench:warm:{uuid.uuid4().hex}"
    for _ in range(8):
        _chain(app, warm).apply_async()
    harness.wait_until(lambda: harness.counter(warm) >= 8, 120, "warm-up chains")
    key = f"bench:chains:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for _ in range(count):
        _chain(app, key).apply_async()
    harness.wait_until(lambda: harness.counter(key) >= count, 600, f"{count} chains")
    return count / (time.perf_counter() - started)


def turn_latencies(settings: Settings, turns: int) -> list[float]:
    """Seconds from send to committed reply, one turn at a time on an idle system."""
    client = AgentClient(settings)
    session_id = f"lat-{uuid.uuid4().hex[:8]}"
    for n in range(turns):
        client.send_message(session_id, f"hello number {n}", user_id="bench-user")
        harness.wait_until(lambda n=n: harness.answered(session_id) > n, 60, "a turn")
    return _latencies_from_timestamps(session_id)[2:]  # the first turns warm up


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


def chain_latencies(settings: Settings, count: int) -> list[float]:
    """Seconds from sending a bare six-hop chain to its last hop's timestamp."""
    app = make_app(settings)
    r = harness.redis.Redis.from_url(harness.REDIS_URL)
    latencies = []
    for _ in range(count + 2):
        key = f"bench:stamp:{uuid.uuid4().hex}"
        links = [
            app.signature("agentstate.baseline.noop", args=[None], immutable=True)
            for _ in range(HOPS - 1)
        ]
        links.append(app.signature("agentstate.baseline.stamp", args=[key], immutable=True))
        sent = time.time()
        chain(*links).apply_async()
        stamped = keys.baseline_counter(key)
        harness.wait_until(lambda k=stamped: r.exists(k) == 1, 60, "a chain")
        latencies.append(float(r.get(stamped) or 0) - sent)
    return latencies[2:]


# -- history growth ------------------------------------------------------------------


def grow_history(session_id: str, extra: int) -> None:
    """Give a session ``extra`` more history items directly in the database."""
    engine = get_engine(harness.DATABASE_URL)
    with engine.begin() as conn:
        count = conn.execute(
            select(sessions.c.message_count).where(sessions.c.session_id == session_id)
        ).scalar_one()
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
            .values(message_count=count + extra, revision=sessions.c.revision + 1)
        )


def history_latency(settings: Settings, history: int, turns: int) -> float:
    client = AgentClient(settings)
    session_id = f"hist-{history}-{uuid.uuid4().hex[:6]}"
    client.send_message(session_id, "hello", user_id="bench-user")
    client.wait_for_idle(session_id, timeout=60)
    if history > 2:
        grow_history(session_id, history - 2)
    for n in range(turns):
        client.send_message(session_id, f"hello number {n}", user_id="bench-user")
        client.wait_for_idle(session_id, timeout=60)
    latencies = _latencies_from_timestamps(session_id)[3:]
    return harness.median(latencies)


# -- workflows -----------------------------------------------------------------------


def layered_dag(layers: int = 10, width: int = 100) -> dict[str, Any]:
    steps = []
    for layer in range(layers):
        for i in range(width):
            deps = [] if layer == 0 else [f"L{layer - 1}-{i}", f"L{layer - 1}-{(i + 1) % width}"]
            steps.append(
                {
                    "step_id": f"L{layer}-{i}",
                    "action": "echo",
                    "inputs": {"i": i},
                    "dependencies": deps,
                }
            )
    return {"steps": steps}


def dag_seconds(settings: Settings) -> float:
    client = AgentClient(settings)
    warm = client.start_workflow({"steps": [{"step_id": "w", "action": "echo"}]})
    client.wait_for_workflow(warm, timeout=60)
    spec = layered_dag()
    started = time.perf_counter()
    workflow_id = client.start_workflow(spec)
    doc = client.wait_for_workflow(workflow_id, timeout=600)
    assert doc["status"] == "success"
    return time.perf_counter() - started


def bare_tasks_seconds(settings: Settings, count: int = 1000) -> float:
    app = make_app(settings)
    key = f"bench:bare:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for _ in range(count):
        app.send_task("agentstate.baseline.noop", args=[key])
    harness.wait_until(lambda: harness.counter(key) >= count, 600, f"{count} bare tasks")
    return time.perf_counter() - started


# -- the lock ------------------------------------------------------------------------


def _ours_lock_loop(n: int, session_id: str, out: Any) -> None:
    from state.lock import DistributedStateSync

    sync = DistributedStateSync(settings=harness.bench_settings())
    for _ in range(n):
        sync.update_state_atomic(session_id, _bump)
    out.put(n)


def _bump(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["n"] = doc["metadata"].get("n", 0) + 1
    return doc


def _raw_lock_loop(n: int, key: str, out: Any) -> None:
    import redis as redis_lib

    from state.storage.redis_client import RELEASE

    r = redis_lib.Redis.from_url(harness.REDIS_URL)
    release = r.register_script(RELEASE)
    token = uuid.uuid4().hex
    done = 0
    while done < n:
        if r.set(f"{key}:lock", token, nx=True, px=30000):
            r.incr(f"{key}:n")
            release(keys=[f"{key}:lock"], args=[token])
            done += 1
        else:
            time.sleep(0.001)
    out.put(n)


def lock_rates(processes: int = 4, each: int = 250) -> tuple[float, float]:
    ctx = mp.get_context("spawn")

    def run(target: Any, arg: str) -> float:
        out = ctx.Queue()
        procs = [ctx.Process(target=target, args=(each, arg, out)) for _ in range(processes)]
        started = time.perf_counter()
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        return processes * each / (time.perf_counter() - started)

    ours = run(_ours_lock_loop, f"lock-{uuid.uuid4().hex[:6]}")
    raw = run(_raw_lock_loop, f"bench:rawlock:{uuid.uuid4().hex}")
    return ours, raw


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


# -- LangGraph -----------------------------------------------------------------------


def langgraph_turns_per_second(processes: int, sessions_n: int, per_session: int) -> float:
    """LangGraph + PostgresSaver, a 6-node graph, durability="sync", N processes."""
    script = [sys.executable, "-m", "bench.langgraph_baseline"]
    prefix = f"lg-{uuid.uuid4().hex[:6]}"
    subprocess.run([*script, "setup"], check=True, cwd=harness.REPO)
    share = sessions_n // processes
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*script, "run", f"{prefix}-{p}", str(share), str(per_session)], cwd=harness.REPO
        )
        for p in range(processes)
    ]
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError("the LangGraph baseline failed")
    return share * processes * per_session / (time.perf_counter() - started)


def with_flower(settings: Settings) -> Flower:
    """Flower attached to the broker (it consumes every task event)."""
    flower = Flower(settings, free_port(), cwd=harness.REPO)
    if not flower.wait_ready():
        raise RuntimeError("Flower did not come up")
    time.sleep(1.0)  # let it subscribe to events before the clock starts
    say("Flower attached")
    return flower
