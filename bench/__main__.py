"""``python -m bench`` (``make bench``): every row ours vs its baseline, in one run.

Machines here are small and shared, so no figure is meaningful alone: each row puts
agentstate next to a baseline measured minutes apart on the same machine, and the ratio
is what to read.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench import eventlog, harness, rows
from bench.harness import say
from bench.rows import Row
from config import HopPolicy
from config.settings import DbPooler, QueueType

SHAPES = {  # (worker processes, concurrency, pool)
    "prefork 2x1": (2, 1, "prefork"),
    "prefork 1x2": (1, 2, "prefork"),
    "threads 1x2": (1, 2, "threads"),
    "solo 2x1": (2, 1, "solo"),
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument(
        "--rows",
        default="all",
        help="comma-separated: pools,events,langgraph,latency,history,dag,lock,"
        "memory,brokers,pooling,push,eventlog,turncost,storage (default all)",
    )
    parser.add_argument("--memory-turns", type=int, default=10_000)
    args = parser.parse_args()
    wanted = set(args.rows.split(",")) if args.rows != "all" else set(ROWS)
    scale = 0.25 if args.quick else 1.0
    harness.fresh_database()
    harness.flush_redis()
    table: list[Row] = []
    notes: list[str] = []
    started = time.perf_counter()
    for name, measure in ROWS.items():
        if name in wanted:
            print(f"\n[{name}]", flush=True)
            measure(table, notes, scale, args)
    print(render(table, notes, time.perf_counter() - started))


def pools(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s per worker shape: every_phase and inline vs a bare six-hop chain."""
    sessions, per = 50, max(1, int(4 * scale))
    for shape, (count, concurrency, pool) in SHAPES.items():
        settings = harness.bench_settings()
        with harness.workers(settings, count=count, concurrency=concurrency, pool=pool):
            bare = rows.chains_per_second(settings, sessions * per)
            ours = rows.turns_per_second(settings, sessions, per)
        inline = harness.bench_settings(hop_policy=HopPolicy.INLINE)
        with harness.workers(inline, count=count, concurrency=concurrency, pool=pool):
            fast = rows.turns_per_second(inline, sessions, per)
        say(f"{shape}: every_phase {ours:.1f}, inline {fast:.1f}, bare chain {bare:.1f} turns/s")
        table.append(
            Row(
                f"turns/s every_phase [{shape}]",
                ours,
                bare,
                "turns/s",
                "bare 6-hop chain",
                target=">= 0.8x",
            )
        )
        table.append(Row(f"turns/s inline [{shape}]", fast, bare, "turns/s", "bare 6-hop chain"))


def events(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Task events on with Flower attached vs off, for ours and the baseline."""
    sessions, per = 50, max(1, int(4 * scale))
    for label, on in (("events on + Flower", True), ("events off", False)):
        settings = harness.bench_settings(task_events=on)
        flower = rows.with_flower(settings) if on else None
        try:
            with harness.workers(settings, count=2, concurrency=1):
                bare = rows.chains_per_second(settings, sessions * per)
                ours = rows.turns_per_second(settings, sessions, per)
        finally:
            if flower is not None:
                flower.stop()
        say(f"{label}: every_phase {ours:.1f}, bare chain {bare:.1f} turns/s")
        table.append(
            Row(
                f"turns/s every_phase [{label}]",
                ours,
                bare,
                "turns/s",
                "bare 6-hop chain",
                target=">= 0.8x",
            )
        )


def langgraph(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """The fast path vs LangGraph with sync durability (2 processes each)."""
    sessions, per = 50, max(1, int(4 * scale))
    graph = rows.langgraph_turns_per_second(2, sessions, per)
    settings = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(settings, count=2, concurrency=1):
        fast = rows.turns_per_second(settings, sessions, per)
    settings = harness.bench_settings()
    with harness.workers(settings, count=2, concurrency=1):
        every = rows.turns_per_second(settings, sessions, per)
    say(f"LangGraph {graph:.1f}, inline {fast:.1f}, every_phase {every:.1f} turns/s")
    table.append(
        Row(
            "turns/s inline (fast path)",
            fast,
            graph,
            "turns/s",
            "LangGraph PostgresSaver sync",
            target=">= 1.2x",
        )
    )
    table.append(
        Row("turns/s every_phase", every, graph, "turns/s", "LangGraph PostgresSaver sync")
    )


def latency(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """p50 / p95 of one turn on an idle system vs one bare six-hop chain."""
    count = max(10, int(40 * scale))
    settings = harness.bench_settings()
    with harness.workers(settings, count=2, concurrency=1):
        bare = rows.chain_latencies(settings, count)
        ours = rows.turn_latencies(settings, count)
    inline_settings = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(inline_settings, count=2, concurrency=1):
        fast = rows.turn_latencies(inline_settings, count)
    for p in (50, 95):
        base = harness.percentile(bare, p) * 1000
        table.append(
            Row(
                f"turn latency p{p} every_phase",
                harness.percentile(ours, p) * 1000,
                base,
                "ms",
                "bare 6-hop chain",
                higher_is_better=False,
                target="<= 1.25x" if p == 50 else "",
            )
        )
        table.append(
            Row(
                f"turn latency p{p} inline",
                harness.percentile(fast, p) * 1000,
                base,
                "ms",
                "bare 6-hop chain",
                higher_is_better=False,
            )
        )


def history(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """A turn on a session with 5,000 messages vs one with 10."""
    turns = max(8, int(25 * scale))
    settings = harness.bench_settings()
    with harness.workers(settings, count=2, concurrency=1):
        small = rows.history_latency(settings, 10, turns)
        big = rows.history_latency(settings, 5000, turns)
    table.append(
        Row(
            "turn at 5,000 messages (p50)",
            big * 1000,
            small * 1000,
            "ms",
            "turn at 10 messages",
            higher_is_better=False,
            target="<= 1.15x",
        )
    )


def dag(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """A layered 1,000-step DAG vs 1,000 bare Celery tasks on the same workers."""
    settings = harness.bench_settings()
    with harness.workers(settings, count=2, concurrency=1):
        bare = rows.bare_tasks_seconds(settings, 1000)
        ours = rows.dag_seconds(settings)
    table.append(
        Row(
            "1,000-step DAG",
            ours,
            bare,
            "s",
            "1,000 bare tasks",
            higher_is_better=False,
            target="<= 1.3x",
        )
    )


def lock(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Contended update_state_atomic on one session vs a raw SET NX / Lua release loop."""
    ours, raw = rows.lock_rates(processes=4, each=max(50, int(250 * scale)))
    table.append(
        Row("lock hand-off, 4 processes", ours, raw, "updates/s", "raw SET NX + Lua release")
    )
    notes.append(
        "lock hand-off: ours includes a database read and a guarded commit per "
        "update; the raw loop only increments a Redis counter."
    )


def memory(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Worker RSS before and after many turns (inline policy, to get there sooner)."""
    turns = max(500, int(args.memory_turns * scale))
    settings = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(settings, count=2, concurrency=1) as group:
        rows.turns_per_second(settings, 10, 2)
        before = harness.rss_kib(group.pids())
        rows.turns_per_second(settings, 50, turns // 50)
        after = harness.rss_kib(group.pids())
    table.append(
        Row(
            f"worker RSS after {turns:,} turns",
            after / 1024,
            before / 1024,
            "MiB",
            "RSS at start",
            higher_is_better=False,
            target="flat",
        )
    )


def brokers(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s with RabbitMQ as the broker (quorum and classic queues) vs Redis."""
    from tests.infra import RabbitVhost

    rabbit = RabbitVhost(harness.AMQP_URL).ensure()
    sessions, per = 20, max(1, int(5 * scale))
    runs: dict[str, dict[str, Any]] = {
        "Redis": {},
        "RabbitMQ quorum": {"broker_url": rabbit.url},
        "RabbitMQ classic": {"broker_url": rabbit.url, "broker_queue_type": QueueType.CLASSIC},
    }
    rounds: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(2):  # the brokers take turns, so that load from elsewhere hits each alike
        for label, overrides in runs.items():
            settings = harness.bench_settings(**overrides)
            try:
                with harness.workers(settings, count=2, concurrency=1):
                    rounds[label].append(rows.turns_per_second(settings, sessions, per))
            finally:
                if "broker_url" in overrides:
                    rabbit.delete_queue(settings.queue)
            say(f"{label}: every_phase {rounds[label][-1]:.1f} turns/s")
    measured = {label: harness.median(values) for label, values in rounds.items()}
    for label in ("RabbitMQ quorum", "RabbitMQ classic"):
        table.append(
            Row(
                f"turns/s every_phase [{label}]",
                measured[label],
                measured["Redis"],
                "turns/s",
                "Redis broker",
            )
        )
    notes.append(
        "brokers: RabbitMQ publishes with confirms; a quorum queue also fsyncs each "
        "message to its log before confirming (one node here)."
    )


def pooling(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """The inline fast path through PgBouncer (transaction mode, unprepared statements)
    vs straight to Postgres (prepared), and unprepared straight to Postgres."""
    from tests.infra import PgBouncer

    bouncer = PgBouncer(pool_size=10).start()
    sessions, per = 20, max(1, int(5 * scale))
    runs: dict[str, dict[str, Any]] = {
        "prepared, direct": {},
        "unprepared, direct": {"db_pooler": DbPooler.PGBOUNCER},
        "unprepared, PgBouncer": {
            "db_pooler": DbPooler.PGBOUNCER,
            "database_url": f"{bouncer.server}/{harness.BENCH_DB}",
        },
    }
    measured: dict[str, float] = {}
    try:
        configured = {
            label: harness.bench_settings(hop_policy=HopPolicy.INLINE, **overrides)
            for label, overrides in runs.items()
        }
        commits = rows.commit_micros(configured, max(50, int(200 * scale)))
        for label, settings in configured.items():
            with harness.workers(settings, count=2, concurrency=1):
                measured[label] = rows.turns_per_second(settings, sessions, per)
            say(f"{label}: {commits[label]:.0f} us a commit, inline {measured[label]:.1f} turns/s")
    finally:
        notes.append(f"pooling: {bouncer.version()}, transaction mode, 10 server connections.")
        bouncer.close()
    for label in ("unprepared, direct", "unprepared, PgBouncer"):
        table.append(
            Row(
                f"phase commit [{label}]",
                commits[label],
                commits["prepared, direct"],
                "us",
                "prepared, direct",
                higher_is_better=False,
            )
        )
        table.append(
            Row(
                f"turns/s inline [{label}]",
                measured[label],
                measured["prepared, direct"],
                "turns/s",
                "prepared, direct",
            )
        )


ROWS: dict[str, Callable[[list[Row], list[str], float, Any], None]] = {
    "pools": pools,
    "events": events,
    "langgraph": langgraph,
    "latency": latency,
    "history": history,
    "dag": dag,
    "lock": lock,
    "memory": memory,
    "brokers": brokers,
    "pooling": pooling,
    # The event log (bench/eventlog.py).
    "push": eventlog.push,
    "eventlog": eventlog.throughput,
    "turncost": eventlog.turn_cost,
    "storage": eventlog.storage,
}


def render(table: list[Row], notes: list[str], elapsed: float) -> str:
    lines = [
        "",
        f"agentstate vs baselines (one run, {elapsed / 60:.1f} min; ratio = ours / baseline)",
        "",
        "| measurement | ours | baseline | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row.name} | {row.ours:.1f} {row.unit} | {row.baseline:.1f} {row.unit} "
            f"({row.baseline_name}) | {row.ratio:.2f}x | {row.target} |"
        )
    lines.extend(f"\n{note}" for note in notes)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
