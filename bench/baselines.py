"""The baselines' client side: what each one is sent, and how long it takes, warm.

- bare chain: six ``agentstate.baseline.hop`` tasks, each enqueuing the next (no state);
- floor: six ``agentstate.bench.hop`` tasks that each commit one prepared UPDATE;
- floor + phase write: six ``agentstate.bench.hop_write`` tasks that each commit what a
  phase commits, through the session store;
- commit-once tasks: a workflow step's floor;
- LangGraph in-process and one Celery task per turn; DBOS in-process.

Every Celery baseline is warmed on its workers (connections, prepared statements, graphs)
before its clock starts; the in-process ones go through ``bench.warm``.
"""

from __future__ import annotations

import time
import uuid

import redis
from sqlalchemy import text

from bench import harness, warm
from config import Settings
from state.storage import keys
from state.storage.db import get_engine
from tasks.app import make_app

HOPS = 6
FLOOR_TASKS = "bench.floor_tasks"
LANGGRAPH_TASKS = "bench.langgraph_tasks"


def floor_rows(prefix: str, count: int) -> list[str]:
    """``count`` fresh rows of the floor's table (created if missing); their ids."""
    from bench.floor_tasks import CREATE, TABLE

    ids = [f"{prefix}-{i}" for i in range(count)]
    with get_engine(harness.DATABASE_URL).begin() as conn:
        conn.execute(text(CREATE))
        conn.execute(
            text(f"INSERT INTO {TABLE} (id) VALUES (:id) ON CONFLICT DO NOTHING"),
            [{"id": row_id} for row_id in ids],
        )
    return ids


def _wait_count(key: str, count: int, what: str) -> None:
    harness.wait_until(lambda: harness.counter(key) >= count, 600, what)


def bare_per_second(settings: Settings, count: int) -> float:
    """Bare Celery: chains of six no-op hops per second (each hop enqueues the next)."""
    app = make_app(settings)

    def send(key: str, n: int) -> None:
        for _ in range(n):
            app.send_task("agentstate.baseline.hop", args=[HOPS, key])

    warm_key = f"bench:warm:{uuid.uuid4().hex}"
    send(warm_key, 8)
    _wait_count(warm_key, 8, "warm-up chains")
    key = f"bench:bare:{uuid.uuid4().hex}"
    started = time.perf_counter()
    send(key, count)
    _wait_count(key, count, f"{count} bare chains")
    return count / (time.perf_counter() - started)


def floor_per_second(settings: Settings, sessions: int, per_session: int) -> float:
    """The floor: turns of six hops per second, each hop committing one prepared UPDATE.

    Needs workers with ``AGENTSTATE_ACTION_MODULES=bench.floor_tasks``.
    """
    app = make_app(settings)
    prefix = f"floor-{uuid.uuid4().hex[:6]}"
    ids = floor_rows(prefix, sessions)
    warm_ids = floor_rows(f"{prefix}-warm", 8)

    def send(rows: list[str], key: str) -> None:
        for row_id in rows:
            app.send_task("agentstate.bench.hop", args=[HOPS, row_id, key, False])

    warm_key = f"bench:warm:{uuid.uuid4().hex}"
    send(warm_ids, warm_key)
    _wait_count(warm_key, len(warm_ids), "warm-up floor chains")
    key = f"bench:floor:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for _ in range(per_session):
        send(ids, key)
    total = sessions * per_session
    _wait_count(key, total, f"{total} floor chains")
    return total / (time.perf_counter() - started)


def write_sessions(prefix: str, count: int) -> list[str]:
    """``count`` new sessions at revision 0 for the floor + phase write; their ids."""
    from bench.floor_tasks import WRITE_USER
    from state.sessions.rows import insert_session

    ids = [f"{prefix}-{i}" for i in range(count)]
    with get_engine(harness.DATABASE_URL).begin() as conn:
        for session_id in ids:
            insert_session(conn, session_id, WRITE_USER)
    return ids


def floor_write_per_second(settings: Settings, sessions: int, per_session: int) -> float:
    """The floor with agentstate's phase write: turns of six ``hop_write`` hops per second.

    As many chains at once as the floor sends (``sessions`` x ``per_session``), each on a
    session of its own: a hop's commit is guarded by the revision it carries, so two
    chains on one session would refuse each other's writes.
    """
    app = make_app(settings)
    prefix = f"write-{uuid.uuid4().hex[:6]}"
    total = sessions * per_session
    ids = write_sessions(prefix, total)
    warm_ids = write_sessions(f"{prefix}-warm", 8)

    def send(session_ids: list[str], key: str) -> None:
        for session_id in session_ids:
            app.send_task("agentstate.bench.hop_write", args=[HOPS, session_id, 0, key])

    warm_key = f"bench:warm:{uuid.uuid4().hex}"
    send(warm_ids, warm_key)
    _wait_count(warm_key, len(warm_ids), "warm-up floor + write chains")
    key = f"bench:floor-write:{uuid.uuid4().hex}"
    started = time.perf_counter()
    send(ids, key)
    _wait_count(key, total, f"{total} floor + write chains")
    return total / (time.perf_counter() - started)


class HopProbe:
    """Six hops at a time on an idle system (committing each, or bare): a sample per
    :meth:`once`, from the client's send to the start of the last hop's stamp."""

    def __init__(self, settings: Settings, *, commit: bool) -> None:
        self.app = make_app(settings)
        self.redis = redis.Redis.from_url(harness.REDIS_URL)
        self.row_id = floor_rows(f"lat-{uuid.uuid4().hex[:6]}", 1)[0] if commit else None
        self.samples: list[float] = []

    def once(self) -> None:
        """Send six hops and wait for the last one to have run."""
        probe = f"bench:stamp:{uuid.uuid4().hex}"
        stamped = keys.baseline_counter(probe)
        sent = time.time()
        self.app.send_task("agentstate.bench.hop", args=[HOPS, self.row_id, probe, True])
        harness.wait_until(lambda: self.redis.exists(stamped) == 1, 60, "a chain")
        self.samples.append(float(self.redis.get(stamped) or 0) - sent)

    def latencies(self) -> list[float]:
        """Seconds per chain; the first two warm up and are left out."""
        return self.samples[2:]


def commit_once_seconds(settings: Settings, count: int) -> float:
    """Seconds for ``count`` tasks sent at once, each committing one prepared UPDATE."""
    app = make_app(settings)
    prefix = f"once-{uuid.uuid4().hex[:6]}"
    ids = floor_rows(prefix, count)
    warm_key = f"bench:warm:{uuid.uuid4().hex}"
    for row_id in floor_rows(f"{prefix}-warm", 4):
        app.send_task("agentstate.bench.commit_once", args=[row_id, warm_key])
    _wait_count(warm_key, 4, "warm-up commits")
    key = f"bench:once:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for row_id in ids:
        app.send_task("agentstate.bench.commit_once", args=[row_id, key])
    _wait_count(key, count, f"{count} commit-once tasks")
    return time.perf_counter() - started


# -- LangGraph and DBOS ----------------------------------------------------------------


def langgraph_per_second(processes: int, sessions: int, per_session: int) -> float:
    """LangGraph in-process: ``processes`` processes, each its share of the sessions."""
    prefix = f"lg-{uuid.uuid4().hex[:6]}"
    share = sessions // processes
    shares = [(harness.libpq_url(), f"{prefix}-{p}", share, per_session) for p in range(processes)]
    seconds = warm.run_warm("bench.langgraph_baseline:prepare", shares)
    return share * processes * per_session / seconds


def langgraph_celery_per_second(settings: Settings, sessions: int, per_session: int) -> float:
    """LangGraph, one Celery task per turn (workers with ``bench.langgraph_tasks``)."""
    app = make_app(settings)
    prefix = f"lgc-{uuid.uuid4().hex[:6]}"

    def send(ids: list[str], turns: int, key: str) -> None:
        for thread_id in ids:
            app.send_task("agentstate.bench.langgraph_turn", args=[thread_id, 0, turns, key])

    warm_key = f"bench:warm:{uuid.uuid4().hex}"
    send([f"{prefix}-warm-{i}" for i in range(4)], 2, warm_key)
    _wait_count(warm_key, 4, "warm-up LangGraph turns")
    key = f"bench:lgc:{uuid.uuid4().hex}"
    started = time.perf_counter()
    send([f"{prefix}-{i}" for i in range(sessions)], per_session, key)
    _wait_count(key, sessions, f"{sessions * per_session} LangGraph turns")
    return sessions * per_session / (time.perf_counter() - started)


def dbos_database() -> str:
    """DBOS's system database, fresh and empty, next to the bench database."""
    name = f"{harness.BENCH_DB}_dbos"
    harness.recreate(name)
    return harness.libpq_url(name)


def dbos_per_second(processes: int, sessions: int, per_session: int) -> float:
    """DBOS in-process: ``processes`` processes, a six-step durable workflow per turn."""
    url = dbos_database()
    prefix = f"dbos-{uuid.uuid4().hex[:6]}"
    share = sessions // processes
    shares = [(url, f"{prefix}-{p}", share, per_session) for p in range(processes)]
    seconds = warm.run_warm("bench.dbos_baseline:prepare", shares)
    return share * processes * per_session / seconds
