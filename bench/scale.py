"""Maintenance at scale (issue #47), the ``scale`` row: the recovery sweep, a deep page, a
revision prune and an erasure on a large and a small database, each built in seconds by
bulk inserts shaped like real rows (sessions of many users interleaved in time, revision
records written as turns write them, steps waiting for approvals).

    python -m bench --rows scale               # in the table, with its targets
    python bench/scale.py --sizes 2000,100000  # every figure, as JSON lines

Figures: the sweep's two queries (ms, median of 5), the first and a deep page of the
operator's listing (ms), a prune (rows/s over all, and over its middle and its last third
of batches; ms of a run with nothing due, after a vacuum as autovacuum would) and the
erasure of a user with one in fifty of the sessions (ms per session, unpaced). Works on a
database of its own (the bench database's name with ``_scale``), dropped at the end.
Turns are not run here: another user's p99 during a prune is the ``prune`` row's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import say
from bench.rows import Row
from state import paging
from state.events.retention import revisions_batch
from state.lifecycle.erase import GRACE_S, erase_user
from state.lifecycle.rows import in_batch
from state.recovery.queries import stuck_sessions, stuck_steps
from state.sessions.listing import list_sessions
from state.storage.db import get_engine, upgrade_schema
from state.storage.tables import sessions

REVISIONS = 70  # per session with history: checkpoints 0, 32 and 64 older than the cutoff
ERASED = "scale-erased"
PRUNE_BATCH = 200

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
                            updated_at, generation)
SELECT 'w-' || (i / 10), 's' || mod(i, 10), 'step', 'echo',
       CASE WHEN mod(i, 3) = 0 THEN 'pending' ELSE 'success' END,
       '{{}}', '{{}}', '[]', '[]', 0, 0, CASE WHEN mod(i, 3) = 0 THEN 'pending' END,
       now() - INTERVAL '2 hours', 0
FROM generate_series(0, {steps} - 1) AS i;
"""


def _ms(work: Callable[[], Any], times: int = 5) -> float:
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        taken.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(taken), 2)


def _database_name() -> str:
    return f"{harness.BENCH_DB}_scale"


def _database(n: int) -> Engine:
    harness.recreate(_database_name())
    engine = get_engine(f"{harness.PG_SERVER}/{_database_name()}")
    upgrade_schema(engine)
    historied = max(n // 10, 10)
    sql = _SEED.format(
        n=n,
        users=max(n // 10, 1),
        revisions=REVISIONS,
        historied=historied,
        steps=max(n // 10, 10),
        erased=ERASED,
    )
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.exec_driver_sql(sql)
    _vacuum(engine)
    say(
        f"built {n:,} sessions, {historied * REVISIONS:,} revision records "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return engine


def _vacuum(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")


def measure(n: int) -> dict[str, Any]:
    """Every figure on a fresh database of ``n`` sessions."""
    engine = _database(n)
    try:
        return _measure(engine, n)
    finally:
        engine.dispose()
        harness.drop(_database_name())


def _measure(engine: Engine, n: int) -> dict[str, Any]:
    now = datetime.now(UTC)
    sweep_cutoff = now - timedelta(minutes=1)
    found: dict[str, Any] = {"sessions": n}
    found["sweep_sessions_ms"] = _ms(lambda: stuck_sessions(engine, sweep_cutoff, 100))
    found["sweep_steps_ms"] = _ms(lambda: stuck_steps(engine, sweep_cutoff, 100))
    with engine.connect() as conn:
        deep = conn.execute(
            select(sessions.c.created_at, sessions.c.session_id)
            .order_by(sessions.c.created_at)
            .offset(n // 20)
            .limit(1)
        ).one()
    cursor = paging.encode(deep[0], deep[1])  # 95% of the way down, newest first
    # Taken in turns, so that both see the same machine (a shared one is noisy).
    first, deep_page = [], []
    for _ in range(21):
        first.append(_ms(lambda: list_sessions(engine, limit=50), times=1))
        deep_page.append(_ms(lambda: list_sessions(engine, limit=50, cursor=cursor), times=1))
    found["first_page_ms"] = statistics.median(first)
    found["deep_page_ms"] = statistics.median(deep_page)
    cutoff = now - timedelta(days=30)
    batches: list[tuple[int, float]] = []
    while True:
        started = time.perf_counter()
        checkpoints, deleted = in_batch(
            engine, lambda conn: revisions_batch(conn, cutoff, PRUNE_BATCH), quick_commit=True
        )
        batches.append((deleted, time.perf_counter() - started))
        if checkpoints < PRUNE_BATCH:
            break
    # The checkpoints age in order 0, 32, 64 of every session: the first third of the
    # batches find floors with nothing below, the middle third delete revisions 0-31 of
    # each session, the last third 32-63.
    third = max(len(batches) // 3, 1)
    found["prune_rows"] = sum(d for d, _ in batches)
    found["prune_rows_per_s"] = _rate(batches)
    found["prune_middle_third_rows_per_s"] = _rate(batches[third : 2 * third] or batches)
    found["prune_last_third_rows_per_s"] = _rate(batches[2 * third :] or batches)
    _vacuum(engine)
    found["prune_nothing_due_ms"] = _ms(
        lambda: in_batch(engine, lambda conn: revisions_batch(conn, cutoff, PRUNE_BATCH))
    )
    with engine.connect() as conn:
        owned = conn.execute(
            select(func.count()).select_from(sessions).where(sessions.c.user_id == ERASED)
        ).scalar_one()
    started = time.perf_counter()
    erase_user(engine, redis.Redis.from_url(harness.REDIS_URL), ERASED)
    # Less the pause for a late cache write that any erasure of something makes.
    taken = (time.perf_counter() - started - GRACE_S) * 1000
    found["erase_sessions"] = int(owned)
    found["erase_ms"] = round(taken, 1)
    found["erase_ms_per_session"] = round(taken / max(int(owned), 1), 3)
    return found


def _rate(batches: list[tuple[int, float]]) -> float:
    rows, seconds = sum(d for d, _ in batches), sum(t for _, t in batches)
    return round(rows / seconds) if seconds else 0.0


def scale(table: list[Row], notes: list[str], size: float, args: Any) -> None:
    """The ``scale`` row group: large vs small database, and deep vs first."""
    large_n, small_n = max(int(100_000 * size), 500), max(int(2_000 * size), 100)
    small, large = measure(small_n), measure(large_n)
    say(json.dumps(small))
    say(json.dumps(large))
    big, little = f"{large_n:,} sessions", f"{small_n:,}"
    sweep = ("sweep_sessions_ms", "sweep_steps_ms")
    table += [
        Row(
            f"recovery sweep, {big} vs {little}",
            sum(large[k] for k in sweep),
            sum(small[k] for k in sweep),
            "ms",
            f"the same on {little} sessions",
            higher_is_better=False,
            target="<= 1.5x",
        ),
        Row(
            f"page 95% down the listing of {big} vs its first",
            large["deep_page_ms"],
            large["first_page_ms"],
            "ms",
            "the first page",
            higher_is_better=False,
            target="<= 1.5x",
        ),
        Row(
            f"prune rows/s, last third of {large['prune_rows']:,} rows vs middle",
            large["prune_last_third_rows_per_s"],
            large["prune_middle_third_rows_per_s"],
            "rows/s",
            "rows/s of the middle third",
            target=">= 0.67x",
        ),
        Row(
            f"prune with nothing due, {big} vs {little}",
            large["prune_nothing_due_ms"],
            small["prune_nothing_due_ms"],
            "ms",
            f"the same on {little} sessions",
            higher_is_better=False,
            target="<= 1.5x",
        ),
        Row(
            f"erasure per session, {large['erase_sessions']:,} of {big} vs "
            f"{small['erase_sessions']:,} of {little}",
            large["erase_ms_per_session"],
            small["erase_ms_per_session"],
            "ms",
            "per session on the small database",
            higher_is_better=False,
            target="<= 1.5x",
        ),
    ]
    notes.append(
        f"scale: {large['prune_rows']:,} revision records pruned at "
        f"{large['prune_rows_per_s']:,} rows/s; sweep {large['sweep_sessions_ms']} + "
        f"{large['sweep_steps_ms']} ms at {big}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,100000", help="sessions, comma-separated")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        print(json.dumps(measure(size)), flush=True)


if __name__ == "__main__":
    main()
