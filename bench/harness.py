"""Benchmark plumbing: a database and Redis DB indexes of their own, worker groups, timing.

Benchmarks never touch the test database, the demo's data or Redis DB 0: they use the
database ``agentstate_bench`` (and ``agentstate_bench_dbos`` for DBOS's system tables) and
Redis DB indexes 11 (cache and locks) and 12 (broker). ``AGENTSTATE_BENCH_DB_NAME``,
``AGENTSTATE_BENCH_REDIS_URL``, ``AGENTSTATE_BENCH_BROKER_URL`` and
``AGENTSTATE_BENCH_PG_SERVER`` move them (on a machine shared with other runs);
:func:`configure` does the same from code (the smoke test).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, Select, create_engine, func, select, text

from config import Settings
from config.urls import normalise_database_url
from state.storage import keys
from state.storage.db import autocommit_engine, dispose_engines, get_engine, upgrade_schema
from state.storage.tables import inbox
from tasks.worker.processes import WorkerGroup

REPO = Path(__file__).resolve().parents[1]
PG_SERVER = normalise_database_url(
    os.environ.get("AGENTSTATE_BENCH_PG_SERVER", "postgresql+psycopg2://postgres@127.0.0.1:5432")
)
BENCH_DB = os.environ.get("AGENTSTATE_BENCH_DB_NAME", "agentstate_bench")
REDIS_URL = os.environ.get("AGENTSTATE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
BROKER_URL = os.environ.get("AGENTSTATE_BENCH_BROKER_URL", "redis://127.0.0.1:6379/12")
# A RabbitMQ vhost of the benchmarks' own (created with rabbitmqctl when missing).
AMQP_URL = os.environ.get(
    "AGENTSTATE_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/agentstate_bench"
)
DATABASE_URL = f"{PG_SERVER}/{BENCH_DB}"


def configure(*, database: str, redis_url: str, broker_url: str) -> None:
    """Point every later measurement at another database and Redis DB indexes."""
    global BENCH_DB, REDIS_URL, BROKER_URL, DATABASE_URL  # noqa: PLW0603
    BENCH_DB, REDIS_URL, BROKER_URL = database, redis_url, broker_url
    DATABASE_URL = f"{PG_SERVER}/{BENCH_DB}"


def libpq_url(database: str | None = None) -> str:
    """A libpq URL of the bench server (psycopg 3: LangGraph, DBOS's driver)."""
    server = PG_SERVER.replace("postgresql+psycopg2://", "postgresql://")
    return f"{server}/{database or BENCH_DB}"


def say(message: str) -> None:
    """Progress on stderr-like stdout, flushed (benchmarks take minutes)."""
    print(f"  .. {message}", flush=True)


def fresh_database() -> str:
    """Recreate the bench database at the current schema."""
    dispose_engines()
    _forget_poll_engines()
    recreate(BENCH_DB)
    upgrade_schema(get_engine(DATABASE_URL))
    return DATABASE_URL


def recreate(database: str) -> None:
    """Drop (whoever is connected) and create an empty database."""
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    admin.dispose()


def drop(database: str) -> None:
    """Drop a database if it exists."""
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    admin.dispose()


def flush_redis() -> None:
    """Empty the bench's own Redis DB indexes (cache and locks, broker)."""
    for url in (REDIS_URL, BROKER_URL):
        redis.Redis.from_url(url).flushdb()


def bench_settings(**overrides: Any) -> Settings:
    """Settings on the bench database and Redis DB indexes, with a queue of their own."""
    values: dict[str, Any] = {
        "redis_url": REDIS_URL,
        "broker_url": BROKER_URL,
        "database_url": DATABASE_URL,
        "auto_migrate": False,
        "baseline_tasks": True,
        "queue": f"bench-{uuid.uuid4().hex[:6]}",
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def workers(
    settings: Settings, *, count: int = 2, concurrency: int = 1, pool: str = "prefork"
) -> Iterator[WorkerGroup]:
    """Worker processes for one measurement (WARNING logs: INFO logging costs time)."""
    log_dir = Path(tempfile.mkdtemp(prefix="agentstate-bench-"))
    group = WorkerGroup(
        settings,
        log_dir,
        count=count,
        concurrency=concurrency,
        pool=pool,
        cwd=REPO,
        loglevel="WARNING",
    )
    group.env["PYTHONPATH"] = os.environ.get("BENCH_PYTHONPATH", str(REPO))
    group.start()
    try:
        yield group
    finally:
        group.stop()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not finish within {timeout:g}s")
        time.sleep(0.02)


def analyze() -> None:
    """Fresh planner statistics for the inbox, before a measurement that polls it.

    Production runs autovacuum, which keeps them; this machine's Postgres runs without it.
    With the statistics of a table that was empty, :func:`answered` was planned on the
    index of message states (dropped since, migration 0011) and walked every answered
    message in the database (2.3 ms a poll at 10,000, every 20 ms, on the Postgres the
    workers under test share); without it, such statistics could still make it a table
    scan. Only the
    inbox: the statements under test are written to read by key whatever the statistics
    (``tests/integration/test_statement_plans.py``).
    """
    with autocommit_engine(get_engine(DATABASE_URL)).connect() as conn:
        conn.exec_driver_sql("ANALYZE inbox")


def answered(session_ids: Sequence[str]) -> int:
    """How many inbox messages of these sessions have their reply.

    By the sessions' ids, never by a pattern (a ``LIKE`` on the id walked every answered
    message in the database), on a connection of the poll's own (:func:`_poll_engine`),
    in autocommit: a poll is one round trip, not three.
    """
    with _poll_engine(DATABASE_URL).connect() as conn:
        return int(conn.execute(answered_query(session_ids)).scalar_one())


def answered_plan(session_ids: Sequence[str]) -> str:
    """The plan Postgres runs :func:`answered` by, for these ids, executed."""
    engine = _poll_engine(DATABASE_URL)
    sql = str(answered_query(session_ids).compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN ANALYZE {sql}"))


def answered_query(session_ids: Sequence[str]) -> Select[tuple[int]]:
    """The count :func:`answered` runs."""
    return (
        select(func.count())
        .select_from(inbox)
        .where(inbox.c.session_id.in_(session_ids), inbox.c.state == "answered")
    )


_poll_engines: dict[str, Engine] = {}


def _poll_engine(url: str) -> Engine:
    """Connections for the completion poll, which never scan the inbox.

    The poll is the bench's own work on the Postgres the workers under test share, every
    20 ms, where the baselines' completion is a Redis counter: it must cost next to
    nothing whatever the inbox holds. With fresh statistics the planner still took a
    sequential scan for a batch's 50 ids once the inbox held a few thousand rows,
    comparing every row with every id (1.5 ms a poll, where the index of the sessions'
    keys reads only their rows in 0.2 ms).
    """
    if url not in _poll_engines:
        options = {"options": "-c enable_seqscan=off"}
        _poll_engines[url] = create_engine(url, isolation_level="AUTOCOMMIT", connect_args=options)
    return _poll_engines[url]


def _forget_poll_engines() -> None:
    # Before the database is dropped: its connections would be dead.
    while _poll_engines:
        _poll_engines.popitem()[1].dispose()


def counter(name: str) -> int:
    return int(redis.Redis.from_url(REDIS_URL).get(keys.baseline_counter(name)) or 0)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values)


def rss_kib(pids: list[int]) -> int:
    """Resident memory of the given processes, summed."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total
