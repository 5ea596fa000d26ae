"""``python -m bench`` (``make bench``): every row ours vs its baseline, in one run.

Machines here are small and shared, so no figure is meaningful alone: each row puts
agentstate next to a baseline measured minutes apart on the same machine, in the same
worker shape and warm, and the ratio is what to read.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from collections.abc import Callable
from typing import Any

from bench import (
    anatomy,
    automation,
    deploy,
    eventlog,
    fairshare,
    fairtail,
    frameworks,
    harness,
    http,
    interactive,
    langgraph_protocol,
    lifecycle,
    observability,
    suite,
)
from bench import scale as at_scale
from bench.rows import Row

ROWS: dict[str, Callable[[list[Row], list[str], float, Any], None]] = {
    "throughput": suite.throughput,
    "latency": suite.latency,
    "dag": suite.dag,
    "history": suite.history,
    "memory": suite.memory,
    "load": suite.load_held,
    "pools": suite.pools,
    "events": suite.events,
    "carry": suite.carry,
    "lock": suite.lock,
    # Where a turn's CPU goes, by process (bench/anatomy.py).
    "cpu": anatomy.cpu,
    # Deployment choices (bench/deploy.py): RabbitMQ, PgBouncer.
    "brokers": deploy.brokers,
    "pooling": deploy.pooling,
    # The event log (bench/eventlog.py).
    "push": eventlog.push,
    "eventlog": eventlog.throughput,
    "turncost": eventlog.turn_cost,
    "storage": eventlog.storage,
    # The HTTP service (bench/http.py): turns through it, event streams it holds.
    "http": http.http_turns,
    "followers": http.followers,
    # Interactive agents (bench/interactive.py): token streaming, the asyncio client.
    "streaming": interactive.streaming,
    "async": interactive.async_client,
    # The data lifecycle (bench/lifecycle.py): retention's delete rate, its cost to turns.
    "prune": lifecycle.prune,
    # Maintenance at scale (bench/scale.py): sweep, deep page, prune, erasure, 100k vs 2k.
    "scale": at_scale.scale,
    # Fair share (bench/fairshare.py): other users' turns under one user's burst.
    "fairshare": fairshare.fairshare,
    # ... and at the tail (bench/fairtail.py): several users' or operator's long steps.
    "fairtail": fairtail.fairtail,
    # What operators see (bench/observability.py): metrics and OTel on vs off.
    "observability": observability.observability,
    # Schedules and webhooks (bench/automation.py): ticks fired, deliveries sent.
    "ticks": automation.ticks,
    "webhooks": automation.webhooks,
    # Agent frameworks (bench/frameworks.py): a Pydantic AI agent, agentstate vs DBOS.
    "pydantic-ai": frameworks.pydantic_ai,
    # LangGraph's Agent Server protocol (bench/langgraph_protocol.py): runs/s through /lg.
    "lg": langgraph_protocol.lg_runs,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every size at a quarter (minutes, not the better part of an hour): figures "
        "to see that the rows run, not to quote",
    )
    parser.add_argument(
        "--rows",
        default="all",
        help="comma-separated row groups to run, in the order listed below (default all); "
        "`make bench ROWS=throughput,latency` passes it on",
    )
    parser.add_argument(
        "--memory-turns",
        type=int,
        default=10_000,
        help="turns of the memory row before RSS is read again (default 10000)",
    )
    args = parser.parse_args()
    wanted = set(args.rows.split(",")) if args.rows != "all" else set(ROWS)
    unknown = wanted - set(ROWS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))} (known: {', '.join(ROWS)})")
    scale = 0.25 if args.quick else 1.0
    harness.fresh_database()
    harness.flush_redis()
    table: list[Row] = []
    notes: list[str] = []
    load_before = os.getloadavg()[1]
    started = time.perf_counter()
    for name, measure in ROWS.items():
        if name in wanted:
            print(f"\n[{name}]", flush=True)
            began = time.perf_counter()
            measure(table, notes, scale, args)
            print(f"  .. {name}: {time.perf_counter() - began:.0f}s", flush=True)
    notes.append(
        f"machine: {os.cpu_count()} CPUs, load average (5 min) {load_before:.1f} at the start "
        f"and {os.getloadavg()[1]:.1f} at the end (this run's own work included)."
    )
    print(render(table, notes, time.perf_counter() - started, quick=args.quick))


def _epilog() -> str:
    """The row groups, each with the first line of its docstring."""
    lines = ["row groups:"]
    for name, measure in ROWS.items():
        summary = " ".join((measure.__doc__ or "").strip().split("\n\n")[0].split())
        lines.append(
            textwrap.fill(summary, 92, initial_indent=f"  {name:<11} ", subsequent_indent=" " * 14)
        )
    lines += [
        "",
        "examples:",
        "  python -m bench                              every row (make bench)",
        "  python -m bench --rows throughput,latency    the goals' throughput and latency",
        "  python -m bench --rows throughput --quick    a quick look at one group",
    ]
    return "\n".join(lines)


def render(table: list[Row], notes: list[str], elapsed: float, *, quick: bool = False) -> str:
    """The table in Markdown: one line per row, ours and the baseline side by side."""
    size = " with --quick (small sizes)" if quick else ""
    lines = [
        "",
        f"agentstate vs baselines (one run{size}, {elapsed / 60:.1f} min; "
        "ratio = ours / baseline; all warm)",
        "",
        "| measurement | ours | baseline | ratio | target | |",
        "|---|---|---|---|---|---|",
    ]
    for row in table:
        lines.append(
            f"| {row.name} | {_figure(row.ours)} {row.unit} | {_figure(row.baseline)} "
            f"{row.unit} ({row.baseline_name}) | {row.ratio:.2f}x | {row.target} | "
            f"{row.verdict} |"
        )
    lines.extend(f"\n{note}" for note in notes)
    return "\n".join(lines)


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


if __name__ == "__main__":
    main()
