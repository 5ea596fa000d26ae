"""Fair share at the tail (issue #40): another user's turns, slowest and p99, while long
steps of several users (two at their caps), or of operator code with no user, would
fill every child; two workers of two children started the plain way, default settings.
The baseline is the same run as before issue #40: AGENTSTATE_CHILDREN_FOR_TURNS=0 (the
per-user caps alone) and, for operator work, no cap at all (it had none)."""

from __future__ import annotations

import time
from typing import Any

from bench import harness
from bench.fairshare import PLAIN, _session, _turns
from bench.rows import Row
from config import Settings
from tasks.client import AgentClient

CHAIN = [
    {"step_id": "a", "action": "echo"},
    {"step_id": "b", "action": "echo", "dependencies": ["a"]},
    {"step_id": "c", "action": "echo", "dependencies": ["b"]},
]


def _long(n: int, seconds: float) -> list[dict[str, Any]]:
    return [
        {"step_id": f"long{i}", "action": "sleep", "inputs": {"seconds": seconds}} for i in range(n)
    ]


def _scenario(settings: Settings, who: str, long_s: float, turns: int) -> tuple[list[float], float]:
    """Turns of another user, and a third user's 3-step workflow's seconds, while long
    steps run: two users' 3 each (``who`` "users") or 6 of no owner ("operator")."""
    with harness.workers(settings, **PLAIN):
        client = AgentClient(settings)
        other, third = _session(client, "other"), _session(client, "third")
        if who == "users":
            owners = [_session(client, f"heavy{i}") for i in range(2)]
            started = [
                client.start_workflow({"session_id": s, "steps": _long(3, long_s)}) for s in owners
            ]
        else:
            started = [client.start_workflow({"steps": _long(6, long_s)})]
        time.sleep(min(1.0, long_s / 4))  # the long steps take their children
        # The workflow is started first and awaited after the turns: both while the
        # long steps run (the turns are measured one at a time meanwhile).
        began = time.perf_counter()
        chain = client.start_workflow({"session_id": third, "steps": CHAIN})
        took = _turns(client, other, "other", turns)
        client.wait_for_workflow(chain, timeout=600)
        third_s = time.perf_counter() - began
        for workflow_id in started:
            client.wait_for_workflow(workflow_id, timeout=1800)
    return took, third_s


def fairtail(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Another user's turn p50/p99/max, fleet cap on vs off, for each scenario."""
    long_s, turns = max(1.0, 20.0 * scale), max(3, int(20 * scale))
    capped = harness.bench_settings()
    # What was there before: the per-user caps alone, and operator work not capped.
    before = {
        "users": harness.bench_settings(children_for_turns=0),
        "operator": harness.bench_settings(children_for_turns=0, user_step_concurrency=0),
    }
    for who, label in (("users", "two users at their caps"), ("operator", "operator work")):
        ours, ours_third = _scenario(capped, who, long_s, turns)
        base, base_third = _scenario(before[who], who, long_s, turns)
        for name, pick in (
            ("p50", lambda v: harness.percentile(v, 50)),
            ("p99", lambda v: harness.percentile(v, 99)),
            ("max", max),
        ):
            table.append(
                Row(
                    f"fair tail: other user's turn {name}, {label}",
                    pick(ours) * 1000,
                    pick(base) * 1000,
                    "ms",
                    f"before #40, {name}",
                    higher_is_better=False,
                    target="report",
                )
            )
        notes.append(
            f"fair tail ({label}): long steps of {long_s:g} s; a third user's 3-step "
            f"workflow took {ours_third:.2f} s (before: {base_third:.2f} s); "
            f"AGENTSTATE_CHILDREN_FOR_TURNS={capped.children_for_turns}, 2 workers x 2 children."
        )
