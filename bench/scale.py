"""Maintenance at scale (issue #47): the recovery sweep, a deep page, a revision prune and
an erasure, each on a small and a large database built in seconds with bulk inserts
shaped like real rows (sessions of many users interleaved in time, revision records
written as turns write them, steps waiting for approvals).

    python bench/scale.py                      # 2,000 and 100,000 sessions
    python bench/scale.py --sizes 2000,20000   # quicker

Figures: the sweep's two queries (ms, median of 5), the first and a deep page of the
operator's listing (ms), a prune (rows/s over all, over its first and its last third of
batches; ms of a run with nothing due) and the erasure of a user with one in fifty of the
sessions (ms, unpaced). Works on a database of its own (``agentstate_bench_scale``, on
AGENTSTATE_BENCH_PG_SERVER or the local server), dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from state.events.retention import revisions_batch
from state.lifecycle.erase import erase_user
from state.lifecycle.rows import in_batch
from state.recovery.queries import stuck_sessions, stuck_steps
from state.sessions.listing import list_sessions
from state.storage.db import get_engine, upgrade_schema
from state.storage.tables import sessions

PG_SERVER = os.environ.get(
    "AGENTSTATE_BENCH_PG_SERVER", "postgresql+psycopg2://postgres@127.0.0.1:5432"
)
REDIS_URL = os.environ.get("AGENTSTATE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
DB_NAME = "agentstate_bench_scale"
REVISIONS = 70  # per session with history: checkpoints 0, 32 and 64 older than the cutoff
ERASED = "scale-erased"

_SEED = """
INSERT INTO sessions (session_id, user_id, phase, status, revision, doc, created_at, updated_at)
SELECT 's-' || lpad(i::text, 7, '0'),
       CASE WHEN mod(i, 50) = 7 THEN '{erased}' ELSE 'u-' || mod(i, {users}) END,
       CASE WHEN i < 10 THEN 'executing' WHEN mod(i, 20) = 1 THEN 'awaiting_approval'
            ELSE 'idle' END,
       'active', {revisions}, '{{"k": "v"}}',
       TIMESTAMPTZ '2026-01-01' + i * INTERVAL '1 second', now() - INTERVAL '2 hours'
FROM generate_series(0, {n} - 1) AS i;

INSERT INTO revisions (session_id, revision, phase, status, at, message_count, event_seq,
                       doc, patch)
SELECT 's-' || lpad(s::text, 7, '0'), r, 'idle', 'active',
       CASE WHEN r < 66
            THEN now() - INTERVAL '40 days' + (r * {historied} + s) * INTERVAL '1 second'
            ELSE now() - INTERVAL '1 hour' END,
       0, 0,
       CASE WHEN mod(r, 32) = 0 THEN '{{"k": "v", "context_window": {{"n": 1}}}}'::jsonb END,
       CASE WHEN mod(r, 32) <> 0 THEN '{{"context_window": ["~", {{"n": ["=", 2]}}]}}' END
FROM generate_series(0, {revisions} - 1) AS r, generate_series(0, {historied} - 1) AS s;

INSERT INTO workflow_steps (workflow_id, step_id, step_name, action, status, inputs, outputs,
                            dependencies, dependents, remaining_deps, max_retries, approval,
                            updated_at)
SELECT 'w-' || (i / 10), 's' || mod(i, 10), 'step', 'echo',
       CASE WHEN mod(i, 3) = 0 THEN 'pending' ELSE 'success' END,
       '{{}}', '{{}}', '[]', '[]', 0, 0, CASE WHEN mod(i, 3) = 0 THEN 'pending' END,
       now() - INTERVAL '2 hours'
FROM generate_series(0, {steps} - 1) AS i;
"""


def _ms(work: Callable[[], Any], times: int = 5) -> float:
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        taken.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(taken), 2)


def _database(n: int) -> Any:
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {DB_NAME}")
    admin.dispose()
    engine = get_engine(f"{PG_SERVER}/{DB_NAME}")
    upgrade_schema(engine)
    historied = max(n // 10, 10)
    sql = _SEED.format(
        n=n,
        users=max(n // 10, 1),
        revisions=REVISIONS,
        historied=historied,
        steps=n // 10,
        erased=ERASED,
    )
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.exec_driver_sql(sql)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    print(
        f"  built {n:,} sessions, {historied * REVISIONS:,} revision records "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return engine


def measure(n: int) -> dict[str, Any]:
    """Every figure on a fresh database of ``n`` sessions."""
    engine = _database(n)
    now = datetime.now(UTC)
    sweep_cutoff = now - timedelta(minutes=1)
    found: dict[str, Any] = {"sessions": n}
    found["sweep_sessions_ms"] = _ms(lambda: stuck_sessions(engine, sweep_cutoff, 100))
    found["sweep_steps_ms"] = _ms(lambda: stuck_steps(engine, sweep_cutoff, 100))
    first = list_sessions(engine, limit=50)
    found["first_page_ms"] = _ms(lambda: list_sessions(engine, limit=50))
    with engine.connect() as conn:
        deep = conn.execute(
            select(sessions.c.created_at, sessions.c.session_id)
            .order_by(sessions.c.created_at)
            .offset(n // 20)
            .limit(1)
        ).one()
    from state import paging

    cursor = paging.encode(deep[0], deep[1])  # 95% of the way down
    found["deep_page_ms"] = _ms(lambda: list_sessions(engine, limit=50, cursor=cursor))
    assert first.items
    cutoff = now - timedelta(days=30)
    batches: list[tuple[int, float]] = []
    while True:
        started = time.perf_counter()
        checkpoints, deleted = in_batch(
            engine, lambda conn: revisions_batch(conn, cutoff, 200), quick_commit=True
        )
        batches.append((deleted, time.perf_counter() - started))
        if checkpoints < 200:
            break
    rate = _rate(batches)
    third = max(len(batches) // 3, 1)
    found["prune_rows"] = sum(d for d, _ in batches)
    found["prune_rows_per_s"] = rate
    # Each session's rows go when its newest old checkpoint comes (the last third).
    found["prune_first_third_checkpoints_ms"] = round(
        statistics.mean(t for _, t in batches[:third]) * 1000, 2
    )
    found["prune_last_third_rows_per_s"] = _rate(batches[-third:])
    found["prune_middle_third_rows_per_s"] = _rate(batches[third:-third] or batches)
    found["prune_nothing_due_ms"] = _ms(
        lambda: in_batch(engine, lambda conn: revisions_batch(conn, cutoff, 200))
    )
    client = redis.Redis.from_url(REDIS_URL)
    with engine.connect() as conn:
        owned = conn.execute(
            select(func.count()).select_from(sessions).where(sessions.c.user_id == ERASED)
        ).scalar_one()
    started = time.perf_counter()
    erase_user(engine, client, ERASED)
    found["erase_sessions"] = int(owned)
    found["erase_ms"] = round((time.perf_counter() - started) * 1000, 1)
    engine.dispose()
    return found


def _rate(batches: list[tuple[int, float]]) -> float:
    rows, seconds = sum(d for d, _ in batches), sum(t for _, t in batches)
    return round(rows / seconds) if seconds else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,100000", help="sessions, comma-separated")
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(measure(size))
        print(json.dumps(rows[-1]))
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        for key in small:
            if key.endswith("_ms") and small[key]:
                print(f"{key:40} {small[key]:>10} {large[key]:>10}  x{large[key] / small[key]:.2f}")


if __name__ == "__main__":
    main()
