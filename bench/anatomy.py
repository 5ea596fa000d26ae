"""Where a turn's CPU goes: every process on the machine counted, by the part it plays.

Throughput on these small machines is CPU-bound, so the CPU a turn costs, and which
process pays it, says what a faster turn has to cut. A measurement reads ``/proc`` before
and after a batch of turns: CPU time (user + system) and context switches of the worker
pool children, the worker main processes, Postgres, Redis and this process (the
client), for the floor (six hops, one commit each), the floor with agentstate's phase
write (``bench.floor_tasks.hop_write``), ``every_phase`` and ``inline``, each on workers
of its own in the throughput rows' shape. The floor, its write variant and
``every_phase`` share one worker group and take turns, batch by batch, so their turns/s
are compared pairwise too: the write variant against the floor says what agentstate's
durable write costs a hop, ``every_phase`` against the write variant what the rest of a
phase does (the handler, the FSM, the lock, the cache, the push).

The batch's own warm-up (8 turns or chains) is counted in the batch, for each system
alike. Processes that start or exit during a batch (a Postgres backend connecting) count
only for the part of the batch they lived.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import baselines, harness, rows
from bench.rows import Row
from bench.suite import FLOOR, SHAPE, rounds_of, turns_of
from config import HopPolicy

ROLES = ("children", "worker main", "Postgres", "Redis", "client")
WARM_UP_TURNS = 8  # the warm-up turns (or chains) each batch function runs first
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


WRITE_FLOOR = "floor + phase write"


@dataclass(frozen=True)
class Usage:
    """CPU seconds and context switches, by role (per turn: ms and counts), and the
    batch's turns per second."""

    cpu_s: dict[str, float]
    switches: dict[str, int]
    per_second: float = 0.0


def _read_proc(pid: int) -> tuple[str, int, float, int] | None:
    """(command name, parent pid, CPU seconds, context switches) of ``pid``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    head, _, tail = stat.rpartition(")")
    fields = tail.split()
    cpu_s = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    switches = sum(
        int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    )
    return head.partition("(")[2], int(fields[1]), cpu_s, switches


def _role(pid: int, name: str, parent: int, mains: set[int]) -> str | None:
    if pid == os.getpid():
        return "client"
    if pid in mains:
        return "worker main"
    if parent in mains:
        return "children"
    if name.startswith("postgres"):
        return "Postgres"
    if name.startswith("redis-server"):
        return "Redis"
    return None


def usage(mains: set[int]) -> Usage:
    """What every process of interest has used so far, summed by role."""
    cpu_s = dict.fromkeys(ROLES, 0.0)
    switches = dict.fromkeys(ROLES, 0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        read = _read_proc(int(entry))
        role = None if read is None else _role(int(entry), read[0], read[1], mains)
        if read is not None and role is not None:
            cpu_s[role] += read[2]
            switches[role] += read[3]
    return Usage(cpu_s, switches)


def per_turn(mains: set[int], batch: Callable[[], float], turns: int) -> Usage:
    """Run ``batch`` (``turns`` turns, returning its turns/s); the CPU ms and context
    switches per turn, by role, and that rate."""
    before = usage(mains)
    rate = batch()
    after = usage(mains)
    return Usage(
        {r: (after.cpu_s[r] - before.cpu_s[r]) * 1000 / turns for r in ROLES},
        {r: round((after.switches[r] - before.switches[r]) / turns) for r in ROLES},
        rate,
    )


def cpu(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """CPU and context switches per turn, by process: every_phase and inline vs the floor.

    Not a goal of its own: it says where the throughput rows' time goes.
    """
    sessions, per = turns_of(scale)
    turns = sessions * per + WARM_UP_TURNS
    floor_settings = harness.bench_settings(action_modules=FLOOR)
    inline_settings = harness.bench_settings(hop_policy=HopPolicy.INLINE)
    found: dict[str, list[Usage]] = {"floor": [], WRITE_FLOOR: [], "every_phase": [], "inline": []}
    with harness.workers(floor_settings, **SHAPE) as group:
        mains = {proc.pid for proc in group.procs.values()}
        batches: dict[str, Callable[[], float]] = {
            "floor": lambda: baselines.floor_per_second(floor_settings, sessions, per),
            WRITE_FLOOR: lambda: baselines.floor_write_per_second(floor_settings, sessions, per),
            "every_phase": lambda: rows.turns_per_second(floor_settings, sessions, per),
        }
        _measure(found, batches, mains, turns, rounds_of(scale))
    with harness.workers(inline_settings, **SHAPE) as group:
        mains = {proc.pid for proc in group.procs.values()}
        batches = {"inline": lambda: rows.turns_per_second(inline_settings, sessions, per)}
        _measure(found, batches, mains, turns, rounds_of(scale))
    _rows(table, found)
    _write_rows(table, found)
    notes.append(
        f"cpu: CPU (user + system, /proc) and context switches per turn of every process "
        f"by role, {sessions} sessions x {per} messages a batch, the median of "
        f"{rounds_of(scale)} batches; the whole machine's CPU is about the sum. "
        f"{WRITE_FLOOR}: the floor's hops each committing what a phase commits "
        "(bench.floor_tasks.hop_write); its turns/s rows are the median of the batches' "
        "ratios, each batch's systems run one after the other."
    )


def _measure(
    found: dict[str, list[Usage]],
    batches: dict[str, Callable[[], float]],
    mains: set[int],
    turns: int,
    count: int,
) -> None:
    for batch in batches.values():
        batch()  # imports, pools, prepared statements: before anything is counted
    for _ in range(count):
        for name, batch in batches.items():
            found[name].append(per_turn(mains, batch, turns))


def _rows(table: list[Row], found: dict[str, list[Usage]]) -> None:
    floor = _median(found["floor"])
    for name in ("every_phase", "inline"):
        ours = _median(found[name])
        total = sum(ours.cpu_s.values())
        table.append(_row(f"CPU per turn {name}", total, sum(floor.cpu_s.values()), "ms"))
        for role in ROLES:
            table.append(
                _row(f"CPU per turn {name} [{role}]", ours.cpu_s[role], floor.cpu_s[role], "ms")
            )
        switches = sum(ours.switches.values())
        table.append(
            _row(
                f"context switches per turn {name}",
                switches,
                sum(floor.switches.values()),
                "switches",
            )
        )


def _write_rows(table: list[Row], found: dict[str, list[Usage]]) -> None:
    """The floor + phase write against the floor (turns/s and CPU), and every_phase
    against it: the durable write's share of the gap, and the rest's."""
    floor, write = _median(found["floor"]), _median(found[WRITE_FLOOR])
    table.append(
        _paired(f"turns/s {WRITE_FLOOR}", found[WRITE_FLOOR], found["floor"], "floor: 6 hops")
    )
    table.append(
        _paired("turns/s every_phase", found["every_phase"], found[WRITE_FLOOR], WRITE_FLOOR)
    )
    total = sum(write.cpu_s.values())
    table.append(_row(f"CPU per turn {WRITE_FLOOR}", total, sum(floor.cpu_s.values()), "ms"))
    for role in ROLES:
        table.append(
            _row(f"CPU per turn {WRITE_FLOOR} [{role}]", write.cpu_s[role], floor.cpu_s[role], "ms")
        )


def _paired(name: str, ours: list[Usage], base: list[Usage], base_name: str) -> Row:
    """Medians of turns/s, with the median of the batch-by-batch ratios as the ratio (the
    batches ran side by side; the machine's speed drifts between them)."""
    ratio = statistics.median(a.per_second / b.per_second for a, b in zip(ours, base, strict=True))
    baseline = statistics.median(b.per_second for b in base)
    return Row(name, ratio * baseline, baseline, "turns/s", base_name)


def _row(name: str, ours: float, floor: float, unit: str) -> Row:
    baseline_name = "floor: 6 hops, 1 commit each"
    return Row(name, ours, max(floor, 1e-9), unit, baseline_name, higher_is_better=False)


def _median(found: list[Usage]) -> Usage:
    return Usage(
        {r: statistics.median(u.cpu_s[r] for u in found) for r in ROLES},
        {r: round(statistics.median(u.switches[r] for u in found)) for r in ROLES},
        statistics.median(u.per_second for u in found),
    )
