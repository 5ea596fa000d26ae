"""The rows of ``make bench``: one function per row group, each ours vs its baselines.

Every function has the signature ``(table, notes, scale, args)``: it appends its
:class:`~bench.rows.Row` lines to ``table`` (and any explanation to ``notes``).
Throughput and latency are measured in one worker shape, :data:`SHAPE` (one worker
process with two prefork children) for every Celery system, and two processes for the
in-process ones; every system is timed warm.
"""

from __future__ import annotations

from typing import Any

from bench import baselines, harness, load, rows
from bench.harness import say
from bench.rows import Row
from config import HopPolicy, Settings

SHAPE: dict[str, Any] = {"count": 1, "concurrency": 2, "pool": "prefork"}
SHAPE_NAME = "1 worker x 2 prefork children"
IN_PROCESS = 2  # processes of the in-process baselines
SHAPES = {  # (worker processes, concurrency, pool)
    "prefork 2x1": (2, 1, "prefork"),
    "prefork 1x2": (1, 2, "prefork"),
    "threads 1x2": (1, 2, "threads"),
    "solo 2x1": (2, 1, "solo"),
}
FLOOR = baselines.FLOOR_TASKS

Table = list[Row]


def sized(full: int, scale: float, least: int) -> int:
    """A size: ``full`` scaled (``--quick`` is 0.25; the smoke test goes smaller), >= least."""
    return max(least, int(full * scale))


def turns_of(scale: float) -> tuple[int, int]:
    """Sessions and messages per session of a throughput measurement (50 x 6 in full)."""
    return sized(50, scale, 8), sized(6, scale, 2)


def rounds_of(scale: float) -> int:
    """Rounds of a throughput measurement (3 in full): the best (or median) is reported."""
    return sized(3, scale, 1)


def throughput(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Turns/s: every_phase vs the floor; inline vs LangGraph (two shapes) and DBOS."""
    sessions, per = turns_of(scale)
    rounds = rounds_of(scale)
    best: dict[str, float] = {}
    for _ in range(rounds):
        measured = _throughput_round(sessions, per)
        say(", ".join(f"{name} {value:.1f}" for name, value in measured.items()) + " turns/s")
        for name, value in measured.items():
            best[name] = max(best.get(name, 0.0), value)
    for name, base, base_name, target in (
        ("every_phase", "floor", "floor: 6 hops, 1 commit each", ">= 0.9x"),
        ("inline", "LangGraph", "LangGraph in-process", ">= 1.2x"),
        ("inline", "LangGraph on Celery", "LangGraph, 1 Celery task per turn", ">= 1.5x"),
        ("inline", "DBOS", "DBOS, 6-step durable workflow", ">= 1.5x"),
        ("every_phase", "bare", "bare 6-hop chain", ""),
        ("inline", "bare", "bare 6-hop chain", ""),
        ("floor", "bare", "bare 6-hop chain", ""),
    ):
        table.append(
            Row(f"turns/s {name}", best[name], best[base], "turns/s", base_name, target=target)
        )
    notes.append(
        f"turns/s: {sessions} sessions x {per} messages per system, the best of {rounds} "
        "rounds (a round measures every system in turn; on a shared machine others' work "
        "only ever slows a run down)."
    )


def _throughput_round(sessions: int, per: int) -> dict[str, float]:
    """One measurement of every system, each on workers of its own in :data:`SHAPE`."""
    settings = harness.bench_settings(action_modules=FLOOR)
    with harness.workers(settings, **SHAPE):
        bare = baselines.bare_per_second(settings, sessions * per)
        floor = baselines.floor_per_second(settings, sessions, per)
        every = rows.turns_per_second(settings, sessions, per)
    inline = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(inline, **SHAPE):
        fast = rows.turns_per_second(inline, sessions, per)
    graph_settings = harness.bench_settings(action_modules=baselines.LANGGRAPH_TASKS)
    with harness.workers(graph_settings, **SHAPE):
        graph_celery = baselines.langgraph_celery_per_second(graph_settings, sessions, per)
    return {
        "every_phase": every,
        "inline": fast,
        "floor": floor,
        "bare": bare,
        "LangGraph": baselines.langgraph_per_second(IN_PROCESS, sessions, per),
        "LangGraph on Celery": graph_celery,
        "DBOS": baselines.dbos_per_second(IN_PROCESS, sessions, per),
    }


def latency(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """p50 / p95 of one turn on an idle system vs six hops (committing each, or bare).

    Both worker groups are up at once (an idle one costs nothing) and the four probes
    take turns, so a burst of someone else's work hits them all alike.
    """
    count = sized(60, scale, 3)
    settings = harness.bench_settings(action_modules=FLOOR)
    inline = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(settings, **SHAPE), harness.workers(inline, **SHAPE):
        probes = {
            "floor": baselines.HopProbe(settings, commit=True),
            "bare": baselines.HopProbe(settings, commit=False),
            "every": rows.TurnProbe(settings),
            "inline": rows.TurnProbe(inline),
        }
        for _ in range(count + 2):
            for probe in probes.values():
                probe.once()
    floor, bare, every, fast = (probe.latencies() for probe in probes.values())
    pairs = (
        ("every_phase", every, floor, "floor chain: 6 hops, 1 commit each", "<= 1.2x"),
        ("inline", fast, bare, "bare 6-hop chain", "<= 1.0x"),
    )
    for p in (50, 95):
        for name, ours, base, base_name, target in pairs:
            table.append(
                Row(
                    f"turn latency p{p} {name}",
                    harness.percentile(ours, p) * 1000,
                    harness.percentile(base, p) * 1000,
                    "ms",
                    base_name,
                    higher_is_better=False,
                    target=target if p == 50 else "",
                )
            )


def dag(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """A layered 1,000-step DAG vs 1,000 tasks that commit once each, same workers:
    under each hop policy (inline: a quick step runs a quick step it releases itself)."""
    layers, width = sized(10, scale, 2), sized(100, scale, 5)
    steps, rounds = layers * width, rounds_of(scale)
    settings = harness.bench_settings(action_modules=FLOOR)
    inline = harness.bench_settings(action_modules=FLOOR, hop_policy=HopPolicy.INLINE)
    runs: dict[str, list[float]] = {"once": [], "ours": [], "claimed": [], "continued": []}
    with harness.workers(settings, **SHAPE):
        for _ in range(rounds):  # the baseline and ours take turns
            runs["once"].append(baselines.commit_once_seconds(settings, steps))
            runs["ours"].append(rows.dag_seconds(settings, layers, width))
            runs["claimed"].append(rows.dag_seconds(settings, layers, width, "claimed_echo"))
    with harness.workers(inline, **SHAPE):  # the same shape, started the same way
        runs["continued"] = [rows.dag_seconds(inline, layers, width) for _ in range(rounds)]
    once = min(runs["once"])
    for label, key, target in (
        ("", "ours", "<= 1.3x"),
        (" [claimed steps: action not quick]", "claimed", ""),
        (" [inline policy: released quick steps continue]", "continued", "<= 1.3x"),
    ):
        table.append(
            Row(
                f"{steps:,}-step DAG{label}",
                min(runs[key]),
                once,
                "s",
                f"{steps:,} tasks, 1 commit each",
                higher_is_better=False,
                target=target,
            )
        )
    shown = "; ".join(f"{key} " + ", ".join(f"{s:.2f}" for s in runs[key]) for key in runs)
    notes.append(f"dag: the best of {rounds} rounds (seconds: {shown}).")


def history(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """A turn on a session with 5,000 messages vs one with 10 (turns taken in turn)."""
    turns, grown = sized(25, scale, 5), sized(5000, scale, 50)
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        probes = [rows.TurnProbe(settings, "hist", 10), rows.TurnProbe(settings, "hist", grown)]
        for _ in range(turns):
            for probe in probes:
                probe.once()
    small, big = (harness.median(probe.latencies()) for probe in probes)
    table.append(
        Row(
            f"turn at {grown:,} messages (p50)",
            big * 1000,
            small * 1000,
            "ms",
            "turn at 10 messages",
            higher_is_better=False,
            target="<= 1.15x",
        )
    )


def memory(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Worker RSS before and after many turns (inline policy, to get there sooner)."""
    turns = sized(args.memory_turns, scale, 100)
    settings = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    with harness.workers(settings, **SHAPE) as group:
        rows.turns_per_second(settings, 10, 2)
        before = harness.rss_kib(group.pids())
        rows.turns_per_second(settings, 10, turns // 10)
        after = harness.rss_kib(group.pids())
    table.append(
        Row(
            f"worker RSS after {turns:,} turns",
            after / 1024,
            before / 1024,
            "MiB",
            "RSS at start",
            higher_is_better=False,
            target="<= 1.1x (flat)",
        )
    )


def load_held(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """2,000 sessions x 5 messages at once (every_phase): once each, p99, memory, fairness."""
    sessions, per = sized(2000, scale, 10), 5
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE) as group:
        result = load.burst(settings, group, sessions, per)
    n = f"{result.messages:,}"
    say(
        f"{n} messages: {result.answered_once:,} answered once, {result.extra_replies} extra; "
        f"sent {result.send_rate:.0f}/s, drained {result.drain_rate:.1f}/s"
    )
    p = harness.percentile
    p50 = p(result.latencies, 50)
    rss_after = result.rss_after_kib / 1024
    table += [
        Row(f"load {n}: messages answered exactly once", result.answered_once, result.messages,
            "messages", "messages sent", True, "all, once", check=result.exactly_once),
        Row(f"load {n}: latency p99", p(result.latencies, 99), p50, "s", "latency p50",
            False, "report"),
        Row(f"load {n}: overtaken by a message ready later, max", max(result.left_behind),
            p50, "s", "latency p50", False, "report"),
        Row(f"load {n}: worker RSS after the burst", rss_after, result.rss_half_kib / 1024,
            "MiB", "half-way through it", False, "<= 1.1x (flat)"),
        Row(f"load {n}: worker RSS after the burst", rss_after, result.rss_before_kib / 1024,
            "MiB", "before it", False, "report"),
        Row(f"load {n}: broker Redis memory after the burst", result.broker_after / 1024,
            result.broker_before / 1024, "KiB", "before it", False, "<= 1.1x (flat)"),
    ]  # fmt: skip
    notes.append(
        f"load: {result.sessions:,} sessions x {per} messages, sent at {result.send_rate:.0f} "
        f"messages/s and drained at {result.drain_rate:.1f}/s "
        f"({result.send_rate / result.drain_rate:.0f}x); overtaken: p99 "
        f"{p(result.left_behind, 99):.2f}s (how long a message was still unanswered after "
        "the reply to a message that could only run after it); sessions finished within "
        f"{result.session_finish_spread:.1f}s of each other; worker RSS peaked at "
        f"{result.rss_peak_kib / 1024:.0f} MiB; the cache DB holds "
        f"{result.cache_after / 1024 / 1024:.1f} MiB afterwards (a snapshot per session, "
        "expiring after AGENTSTATE_CACHE_TTL)."
    )


def pools(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Turns/s per worker shape: every_phase and inline vs a bare six-hop chain."""
    sessions, per = sized(50, scale, 8), sized(4, scale, 1)
    for shape, (count, concurrency, pool) in SHAPES.items():
        settings = harness.bench_settings()
        with harness.workers(settings, count=count, concurrency=concurrency, pool=pool):
            bare = baselines.bare_per_second(settings, sessions * per)
            ours = rows.turns_per_second(settings, sessions, per)
        inline = harness.bench_settings(hop_policy=HopPolicy.INLINE)
        with harness.workers(inline, count=count, concurrency=concurrency, pool=pool):
            fast = rows.turns_per_second(inline, sessions, per)
        say(f"{shape}: every_phase {ours:.1f}, inline {fast:.1f}, bare chain {bare:.1f} turns/s")
        table.append(
            Row(f"turns/s every_phase [{shape}]", ours, bare, "turns/s", "bare 6-hop chain")
        )
        table.append(Row(f"turns/s inline [{shape}]", fast, bare, "turns/s", "bare 6-hop chain"))


def events(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Task events on with Flower attached vs off, for ours and the baseline."""
    sessions, per = sized(50, scale, 8), sized(4, scale, 1)
    for label, on in (("events on + Flower", True), ("events off", False)):
        settings = harness.bench_settings(task_events=on)
        flower = rows.with_flower(settings) if on else None
        try:
            with harness.workers(settings, **SHAPE):
                bare = baselines.bare_per_second(settings, sessions * per)
                ours = rows.turns_per_second(settings, sessions, per)
        finally:
            if flower is not None:
                flower.stop()
        say(f"{label}: every_phase {ours:.1f}, bare chain {bare:.1f} turns/s")
        table.append(
            Row(f"turns/s every_phase [{label}]", ours, bare, "turns/s", "bare 6-hop chain")
        )


def carry(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """every_phase with quick phases run from the snapshot their message carries (no
    lock, no cache read) vs without (AGENTSTATE_CARRY_SNAPSHOT=false), each against
    the floor measured on the same workers: turns/s (best of the rounds), then an idle
    turn's p50 with the two worker groups up at once and their probes taking turns."""
    sessions, per = turns_of(scale)
    modes = {
        "carried": harness.bench_settings(action_modules=FLOOR),
        "not carried": harness.bench_settings(action_modules=FLOOR, carry_snapshot=False),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(sized(3, scale, 1)):
        for label, settings in modes.items():
            with harness.workers(settings, **SHAPE):
                floor = baselines.floor_per_second(settings, sessions, per)
                ours = rows.turns_per_second(settings, sessions, per)
            say(f"{label}: every_phase {ours:.1f}, floor {floor:.1f} turns/s")
            if ours > best.get(label, (0.0, 0.0))[0]:
                best[label] = (ours, floor)
    for label, (ours, floor) in best.items():
        table.append(Row(f"turns/s every_phase [{label}]", ours, floor, "turns/s", "floor: 6 hops"))
    on, off = best["carried"][0], best["not carried"][0]
    table.append(Row("turns/s every_phase, carried vs not", on, off, "turns/s", "not carried"))
    _carry_latency(table, modes, sized(60, scale, 3))
    _carry_in_process(table, sized(150, scale, 10), sized(8, scale, 1))
    notes.append(
        "carried: quick phases' messages carry their snapshot (AGENTSTATE_CARRY_SNAPSHOT); "
        "each figure's floor ran on the same workers right before it."
    )


def _carry_latency(table: Table, modes: dict[str, Settings], count: int) -> None:
    on, off = modes["carried"], modes["not carried"]
    with harness.workers(on, **SHAPE), harness.workers(off, **SHAPE):
        probes = {
            "floor": baselines.HopProbe(on, commit=True),
            "carried": rows.TurnProbe(on),
            "not carried": rows.TurnProbe(off),
        }
        for _ in range(count + 2):
            for probe in probes.values():
                probe.once()
    floor, carried, plain = (probe.latencies() for probe in probes.values())
    for label, ours in (("carried", carried), ("not carried", plain)):
        table.append(
            Row(
                f"turn latency p50 every_phase [{label}]",
                harness.percentile(ours, 50) * 1000,
                harness.percentile(floor, 50) * 1000,
                "ms",
                "floor chain: 6 hops, 1 commit each",
                higher_is_better=False,
            )
        )


def _carry_in_process(table: Table, turns: int, rounds: int) -> None:
    # A phase's own cost, without the broker and the worker's main process (which bound
    # the throughput): best of interleaved runs of bench/turn_cost.py.
    from bench import eventlog  # here: eventlog imports this module

    here = str(harness.REPO)
    runs: dict[str, list[float]] = {"carried": [], "not carried": []}
    for _ in range(rounds):
        runs["carried"].append(eventlog.in_process_cost(here, turns)[0])
        runs["not carried"].append(eventlog.in_process_cost(here, turns, "--no-carry")[0])
    say(f"phases' ms per turn in-process: {runs}")
    table.append(
        Row(
            "turn in-process: phases, carried vs not",
            min(runs["carried"]),
            min(runs["not carried"]),
            "ms",
            "not carried",
            higher_is_better=False,
        )
    )


def lock(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Contended update_state_atomic on one session vs a raw SET NX / Lua release loop."""
    ours, raw = rows.lock_rates(processes=4, each=sized(250, scale, 10))
    table.append(
        Row("lock hand-off, 4 processes", ours, raw, "updates/s", "raw SET NX + Lua release")
    )
    notes.append(
        "lock hand-off: ours includes a database read and a guarded commit per "
        "update; the raw loop only increments a Redis counter."
    )
