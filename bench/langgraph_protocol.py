"""LangGraph's Agent Server protocol (``/lg`` on ``agentstate serve``), ``make bench``'s
``lg`` row: runs/s created through ``/lg`` with LangGraph's own pinned client
(``langgraph-sdk``) vs turns/s sent with agentstate's Python client, on the same workers,
the two taking turns (what the protocol's shapes, the HTTP hop and the serve process cost
a run).

And, when ``AGENTSTATE_BENCH_LANGGRAPH_API_PYTHON`` names a Python with ``langgraph-api``
installed, the same runs on LangGraph's own in-memory dev server running the same six-node
graph (bench/langgraph_api_graph.py) with as many background jobs as our worker has
children. ``langgraph-api`` cannot share this project's lock (it wants protobuf < 7 and
jsonschema-rs < 0.45; our extras pin protobuf 7 and schemathesis wants jsonschema-rs 0.60),
so it lives in a virtualenv of its own:
``python -m venv /tmp/lgapi && /tmp/lgapi/bin/pip install langgraph-api==0.16.7
langgraph==1.2.24``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from bench import harness
from bench.harness import REPO, say
from bench.http import _serve
from bench.rows import Row, send_turns
from bench.suite import SHAPE, SHAPE_NAME, sized
from tasks.client import AgentClient
from tasks.worker.processes import free_port


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
    api_python = os.environ.get("AGENTSTATE_BENCH_LANGGRAPH_API_PYTHON")
    if api_python:
        theirs = _langgraph_api(api_python, sessions, per, rounds)
        say(f"/lg {max(results['lg']):.1f}, langgraph-api {max(theirs):.1f} runs/s")
        table.append(
            Row(
                "runs/s through /lg vs langgraph-api (in-memory dev server)",
                max(results["lg"]),
                max(theirs),
                "runs/s",
                "langgraph-api 0.16.7, the same graph, in memory",
                target="report",
            )
        )
        notes.append(
            "lg vs langgraph-api: the same runs created with langgraph-sdk on LangGraph's "
            "dev server (2 background jobs, checkpoints in memory, nothing durable), "
            "each round until the last run of every thread is joined, minutes after /lg's. "
            "Its in-memory queue sleeps 0.5 s between polls when it finds no run "
            "(langgraph_runtime_inmem ops.Runs.next), so one run waits ~1 s however small: "
            "at --quick sizes that poll, not the graph, sets its figure."
        )
    else:
        notes.append(
            "lg: langgraph-api not measured (set AGENTSTATE_BENCH_LANGGRAPH_API_PYTHON to "
            "a Python with langgraph-api installed; see bench/langgraph_protocol.py)."
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


def _langgraph_api(python: str, sessions: int, per: int, rounds: int) -> list[float]:
    """Runs/s of the same rounds on ``langgraph-api``'s in-memory dev server."""
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"langgraph-api-{port}.log"
    graph = str(REPO / "bench" / "langgraph_api_graph.py")
    start = (
        "from langgraph_api.cli import run_server; "
        f"run_server(port={port}, graphs={{'agent': {graph + ':graph'!r}}}, "
        "n_jobs_per_worker=2, open_browser=False)"
    )
    env = {**os.environ, "LANGSMITH_TRACING": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1"}
    with log.open("wb") as out:
        # It pickles its "in-memory" state into .langgraph_api/ in its working directory
        # (and reloads it at start): a fresh directory each run keeps rounds equal.
        where = tempfile.mkdtemp(prefix="langgraph-api-")
        server = subprocess.Popen([python, "-c", start], stdout=out, stderr=out, env=env, cwd=where)
    try:
        lg = get_sync_client(url=f"http://127.0.0.1:{port}", timeout=60)
        harness.wait_until(lambda: _up(lg), 120, f"langgraph-api (see {log})")
        _api_round(lg, 4, 2)  # warm
        return [_api_round(lg, sessions, per) for _ in range(rounds)]
    finally:
        server.terminate()
        server.wait(30)


def _up(lg: SyncLangGraphClient) -> bool:
    try:
        return bool(lg.assistants.search(graph_id="agent"))
    except Exception:  # not listening yet
        return False


def _api_round(lg: SyncLangGraphClient, sessions: int, per: int) -> float:
    ids = [str(uuid.uuid4()) for _ in range(sessions)]  # langgraph-api wants UUIDs
    last: dict[str, str] = {}
    started = time.perf_counter()
    for k in range(per):
        for thread_id in ids:
            run = lg.runs.create(
                thread_id,
                "agent",
                input={"messages": [{"role": "user", "content": f"hello number {k}"}]},
                multitask_strategy="enqueue",
                if_not_exists="create",
            )
            last[thread_id] = run["run_id"]
    for thread_id in ids:  # a thread's runs run in order: its last done, all are
        lg.runs.join(thread_id, last[thread_id])
    took = time.perf_counter() - started
    said = lg.threads.get_state(ids[0])["values"]
    if not isinstance(said, dict) or len(said["messages"]) != 2 * per:
        raise RuntimeError(f"langgraph-api answered {said!r}")
    return sessions * per / took
