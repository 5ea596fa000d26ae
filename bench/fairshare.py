"""The fair-share rows: another user's turns while one user bursts, and the price of the
per-user step cap on a single user's big DAG. Two workers of two children each, started
the plain way (both queues, turns first), at default settings."""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench import harness, rows
from bench.harness import say
from bench.rows import Row
from config import Settings
from tasks.client import AgentClient

PLAIN: dict[str, Any] = {"count": 2, "concurrency": 2, "pool": "prefork"}


def _sizes(scale: float) -> tuple[int, float, int, int]:
    """Long steps, their seconds, quick steps, turns measured (6, 20 s, 3,000, 20 in full)."""
    return 6, max(1.0, 20.0 * scale), max(20, int(3000 * scale)), max(3, int(20 * scale))


def _session(client: AgentClient, user: str) -> str:
    session_id = f"fair-{uuid.uuid4().hex[:8]}"
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=120)
    return session_id


def _turns(client: AgentClient, session_id: str, user: str, n: int) -> list[float]:
    took = []
    for i in range(n):
        started = time.perf_counter()
        client.send_message(session_id, f"what is {i}+1?", user_id=user)
        client.wait_for_idle(session_id, timeout=600)
        took.append(time.perf_counter() - started)
    return took


def _burst(
    client: AgentClient, session_id: str, long_n: int, long_s: float, quick_n: int
) -> list[str]:
    """One user's long steps and quick steps (two workflows of that user's session)."""
    long_steps = [
        {"step_id": f"long{i}", "action": "sleep", "inputs": {"seconds": long_s}}
        for i in range(long_n)
    ]
    quick = [{"step_id": f"q{i}", "action": "echo", "inputs": {"i": i}} for i in range(quick_n)]
    return [
        client.start_workflow({"session_id": session_id, "steps": long_steps}),
        client.start_workflow({"session_id": session_id, "steps": quick}),
    ]


def fairshare(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Another user's turn p50/p95 under one user's burst vs idle; the 1,000-step DAG of
    one user with the default cap vs none."""
    long_n, long_s, quick_n, turns = _sizes(scale)
    settings = harness.bench_settings()
    with harness.workers(settings, **PLAIN):
        client = AgentClient(settings)
        heavy, other = _session(client, "heavy"), _session(client, "other")
        third = _session(client, "third")
        idle = _turns(client, other, "other", turns)
        burst = _burst(client, heavy, long_n, long_s, quick_n)
        started = time.perf_counter()
        chain = client.start_workflow(
            {
                "session_id": third,
                "steps": [
                    {"step_id": "a", "action": "echo"},
                    {"step_id": "b", "action": "echo", "dependencies": ["a"]},
                    {"step_id": "c", "action": "echo", "dependencies": ["b"]},
                ],
            }
        )
        client.wait_for_workflow(chain, timeout=600)
        third_s = time.perf_counter() - started
        loaded = _turns(client, other, "other", turns)
        for workflow_id in burst:
            client.wait_for_workflow(workflow_id, timeout=1800)
    for p in (50, 95, 99, 100):
        name = "max" if p == 100 else f"p{p}"
        table.append(
            Row(
                f"fair-share: other user's turn {name} under a burst",
                harness.percentile(loaded, p) * 1000,
                harness.percentile(idle, p) * 1000,
                "ms",
                f"idle {name}",
                higher_is_better=False,
                target="report",
            )
        )
    notes.append(
        f"fair-share: burst = one user's {long_n} steps of {long_s:g} s and {quick_n:,} quick "
        f"steps; a third user's 3-step workflow finished in {third_s:.2f} s meanwhile; "
        f"AGENTSTATE_USER_STEP_CONCURRENCY={settings.user_step_concurrency}, "
        "2 workers x 2 children."
    )
    _capped_dag(table, notes, scale, settings)


def _dag_seconds(settings: Settings, layers: int, width: int) -> float:
    client = AgentClient(settings)
    session_id = _session(client, "dag-owner")
    spec = {**rows.layered_dag(layers, width), "session_id": session_id}
    started = time.perf_counter()
    workflow_id = client.start_workflow(spec)
    doc = client.wait_for_workflow(workflow_id, timeout=600)
    assert doc["status"] == "success"
    return time.perf_counter() - started


def _capped_dag(table: list[Row], notes: list[str], scale: float, settings: Settings) -> None:
    layers, width = max(2, int(10 * scale)), max(5, int(100 * scale))
    rounds = max(1, int(3 * scale))
    uncapped = harness.bench_settings(user_step_concurrency=0)
    seconds: dict[str, list[float]] = {"capped": [], "uncapped": []}
    for name, chosen in (("capped", settings), ("uncapped", uncapped)):
        with harness.workers(chosen, **PLAIN):
            _dag_seconds(chosen, 1, 1)  # warm
            seconds[name] = [_dag_seconds(chosen, layers, width) for _ in range(rounds)]
            say(f"{name} DAG: " + ", ".join(f"{s:.2f}" for s in seconds[name]))
    table.append(
        Row(
            f"{layers * width:,}-step DAG of one user, cap {settings.user_step_concurrency}",
            min(seconds["capped"]),
            min(seconds["uncapped"]),
            "s",
            "no cap (AGENTSTATE_USER_STEP_CONCURRENCY=0)",
            higher_is_better=False,
            target="<= 1.1x",
        )
    )
