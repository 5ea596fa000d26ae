"""LangGraph's Agent Server protocol (``/lg`` on ``agentstate serve``), ``make bench``'s
``lg`` row: runs/s created through ``/lg`` with LangGraph's own pinned client
(``langgraph-sdk``) vs turns/s sent with agentstate's Python client, on the same workers,
the two taking turns (what the protocol's shapes, the HTTP hop and the serve process cost
a run).

Not yet here: the same graph on LangGraph's own in-memory dev server (``langgraph-api``);
issue #42 asks for it side by side.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from bench import harness
from bench.harness import say
from bench.http import _serve
from bench.rows import Row, send_turns
from bench.suite import SHAPE, SHAPE_NAME, sized
from tasks.client import AgentClient


def lg_runs(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Runs/s through /lg (langgraph-sdk) vs turns/s through AgentClient.send_message."""
    sessions, per = sized(40, scale, 4), sized(5, scale, 2)
    rounds = sized(3, scale, 1)
    settings = harness.bench_settings()
    results: dict[str, list[float]] = {"lg": [], "client": []}
    with harness.workers(settings, **SHAPE):
        server = _serve(settings)
        try:
            lg = get_sync_client(url=f"{server.url}/lg", timeout=60)
            client = AgentClient(settings)
            _lg_round(lg, "warm", 4, 2)  # imports, pools, caches
            send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
            for n in range(rounds):
                for side in ["lg", "client"] if n % 2 == 0 else ["client", "lg"]:
                    if side == "lg":
                        rate = _lg_round(lg, f"l{n}", sessions, per)
                    else:
                        rate = send_turns(client, f"lgc-{n}-{uuid.uuid4().hex[:6]}", sessions, per)
                    results[side].append(rate)
                say(f"/lg {results['lg'][-1]:.1f}, client {results['client'][-1]:.1f} runs/s")
        finally:
            server.stop()
    table.append(
        Row(
            "runs/s through /lg (langgraph-sdk) vs the Python client",
            max(results["lg"]),
            max(results["client"]),
            "runs/s",
            "AgentClient.send_message",
            target=">= 0.9x",
        )
    )
    notes.append(
        f"lg: {sessions} threads x {per} runs, each created with langgraph-sdk's "
        "runs.create (multitask_strategy='enqueue', the thread created by the first) one "
        f"after the other until all are answered, vs as many turns sent with AgentClient; "
        f"the best of {rounds} rounds each, taking turns on the same workers ({SHAPE_NAME})."
    )


def _lg_round(lg: SyncLangGraphClient, tag: str, sessions: int, per: int) -> float:
    ids = [f"lg-{tag}-{uuid.uuid4().hex[:6]}-{i}" for i in range(sessions)]
    harness.analyze()
    started = time.perf_counter()
    for k in range(per):
        for thread_id in ids:
            lg.runs.create(
                thread_id,
                "default",
                input={"messages": [{"role": "user", "content": f"hello number {k}"}]},
                multitask_strategy="enqueue",
                if_not_exists="create",
            )
    total = sessions * per
    harness.wait_until(lambda: harness.answered(ids) >= total, 600, f"{total} runs")
    return total / (time.perf_counter() - started)
