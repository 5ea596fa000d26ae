"""Benchmarks of retention (``state.lifecycle.retention``): how fast a run deletes, against
how fast turns write, and what a run costs the turns running meanwhile.

- prune rows/s: a backlog of old sessions (history, events, revisions) and finished
  workflows (steps), written straight into the database, deleted by one run to
  completion, vs the rows per second turns write on ``every_phase`` workers (each turn's
  messages, inbox row, events and revisions). Retention keeps up only if it deletes far
  faster than turns write: the target is 10x.
- turn p99 while a run deletes such a backlog vs on an idle system, turns taken one at a
  time on the same workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sqlalchemy import func, select, text

from bench import harness, rows
from bench.harness import say
from bench.rows import Row
from bench.suite import SHAPE, sized, turns_of
from config import Settings
from state.lifecycle.retention import prune_all
from state.storage.backend import Backend
from state.storage.db import get_engine
from state.storage.tables import events, inbox, messages, revisions
from tasks.client import AgentClient

PER_SESSION = 20  # messages and events of each old session (and half as many revisions)
STEPS = 10  # steps of each old workflow

_SEED = [
    """INSERT INTO sessions (session_id, user_id, phase, status, revision, doc,
       message_count, inbox_seq, event_seq, recoveries, created_at, updated_at)
     SELECT :tag || i, 'bench-old', 'idle', 'active', 0, '{}', :per, 0, :per, 0,
       now() - interval '400 days', now() - interval '400 days'
     FROM generate_series(1, :sessions) i""",
    """INSERT INTO messages (session_id, seq, role, content, timestamp, metadata)
     SELECT :tag || i, j, 'user', repeat('x', 200), '2025-01-01T00:00:00+00:00', '{}'
     FROM generate_series(1, :sessions) i, generate_series(0, :per - 1) j""",
    """INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
     SELECT :tag || i, j, 'phase_committed', j, 'idle', now() - interval '400 days', '{}'
     FROM generate_series(1, :sessions) i, generate_series(1, :per) j""",
    """INSERT INTO revisions (session_id, revision, phase, status, trigger, at,
       message_count, event_seq, doc, patch)
     SELECT :tag || i, j, 'idle', 'active', 'update', now() - interval '400 days', 0, 0,
       CASE WHEN j = 0 THEN '{}'::jsonb END, CASE WHEN j > 0 THEN '{}' END
     FROM generate_series(1, :sessions) i, generate_series(0, :per / 2 - 1) j""",
    """INSERT INTO workflows (workflow_id, status, context, total_steps, remaining_steps,
       created_at, updated_at, finished_at)
     SELECT :tag || 'wf' || i, 'success', '{}', :steps, 0, now() - interval '400 days',
       now() - interval '400 days', now() - interval '400 days'
     FROM generate_series(1, :workflows) i""",
    """INSERT INTO workflow_steps (workflow_id, step_id, step_name, action, status, inputs,
       outputs, dependencies, dependents, remaining_deps, max_retries, updated_at, generation)
     SELECT :tag || 'wf' || i, 's' || j, 's' || j, 'echo', 'success', '{}', '{}', '[]',
       '[]', 0, 0, now() - interval '400 days', 0
     FROM generate_series(1, :workflows) i, generate_series(1, :steps) j""",
]


def seed_backlog(sessions: int, workflows: int) -> int:
    """Write old sessions and finished workflows straight into the bench database;
    return the rows written."""
    tag = f"old-{uuid.uuid4().hex[:6]}-"
    values = {"tag": tag, "sessions": sessions, "per": PER_SESSION}
    values.update({"workflows": workflows, "steps": STEPS})
    with get_engine(harness.DATABASE_URL).begin() as conn:
        written = sum(int(conn.execute(text(sql), values).rowcount) for sql in _SEED)
        conn.exec_driver_sql("ANALYZE")
    return written


def pruning(settings: Settings) -> Settings:
    """``settings`` with sessions and workflows kept 30 days."""
    return settings.model_copy(update={"sessions_retain_days": 30.0, "workflows_retain_days": 30.0})


def prune_once(settings: Settings) -> tuple[int, float]:
    """One retention run to completion: rows deleted, seconds taken."""
    backend = Backend.build(settings)
    started = time.perf_counter()
    counts = prune_all(backend.engine, backend.redis, settings)
    elapsed = time.perf_counter() - started
    return sum(n for kind, n in counts.items() if kind != "redis_keys"), elapsed


def written_rows() -> int:
    """Rows of the tables a turn writes (history, inbox, events, revisions)."""
    with get_engine(harness.DATABASE_URL).connect() as conn:
        return sum(
            int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (messages, inbox, events, revisions)
        )


def prune(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Prune rows/s vs every_phase's write rate; turn p99 while pruning vs not."""
    backlog_sessions, backlog_workflows = sized(4000, scale, 20), sized(1000, scale, 5)
    sessions_n, per = turns_of(scale)
    settings = pruning(harness.bench_settings())
    with harness.workers(settings, **SHAPE):
        client = AgentClient(settings)
        rows.send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
        before = written_rows()
        turns_per_s = rows.send_turns(client, f"wr-{uuid.uuid4().hex[:6]}", sessions_n, per)
        per_turn = (written_rows() - before) / (sessions_n * per)
        write_rate = turns_per_s * per_turn
        seeded = seed_backlog(backlog_sessions, backlog_workflows)
        deleted, elapsed = prune_once(settings)
        prune_rate = deleted / elapsed
        say(
            f"turns write {write_rate:,.0f} rows/s ({turns_per_s:.1f} turns/s x "
            f"{per_turn:.1f} rows); prune deleted {deleted:,} of {seeded:,} seeded rows "
            f"in {elapsed:.2f}s: {prune_rate:,.0f} rows/s"
        )
        table.append(
            Row(
                "prune rows/s (one run to completion)",
                prune_rate,
                write_rate,
                "rows/s",
                "rows/s every_phase turns write",
                target=">= 10x",
            )
        )
        idle, busy = _p99_with_and_without(settings, backlog_sessions, backlog_workflows, scale)
    table.append(
        Row(
            "turn latency p99 every_phase, pruning vs not",
            busy * 1000,
            idle * 1000,
            "ms",
            "p99 with no prune running",
            higher_is_better=False,
        )
    )
    notes.append(
        f"prune: a backlog of {backlog_sessions:,} old sessions ({PER_SESSION} messages, "
        f"{PER_SESSION} events, {PER_SESSION // 2} revisions each) and {backlog_workflows:,} "
        f"finished workflows ({STEPS} steps each), deleted by one run; the write rate is "
        f"{sessions_n} sessions x {per} messages on {SHAPE['count']} worker(s)."
    )


def _p99_with_and_without(
    settings: Settings, sessions: int, workflows: int, scale: float
) -> tuple[float, float]:
    """Turn p99 (s) one at a time on an idle system, then while runs delete backlogs."""
    count = sized(100, scale, 5)
    quiet = rows.TurnProbe(settings, "quiet")
    for _ in range(count + 2):
        quiet.once()
    loaded = rows.TurnProbe(settings, "loaded")
    done = threading.Event()

    def keep_pruning() -> None:
        while not done.is_set():
            seed_backlog(sessions, workflows)
            prune_once(settings)

    pruner = threading.Thread(target=keep_pruning, daemon=True)
    pruner.start()
    try:
        for _ in range(count + 2):
            loaded.once()
    finally:
        done.set()
        pruner.join(300)
    p99 = (harness.percentile(probe.latencies(), 99) for probe in (quiet, loaded))
    return next(p99), next(p99)
