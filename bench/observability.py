"""The cost of what operators see: turns/s and worker CPU per turn with Prometheus
metrics on (AGENTSTATE_METRICS_PORT), with OpenTelemetry on (AGENTSTATE_OTEL, spans to a
local OTLP receiver that accepts and drops them), and with both, vs both off.

Every mode has its own workers in the same shape, all up at once and warm, and they take
turns batch by batch (the order rotating), so a machine shared with others slows them
alike: each figure sums many short batches spread over the same minutes.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import harness, rows
from bench.rows import Row
from bench.suite import SHAPE, SHAPE_NAME, sized
from tasks.client import AgentClient
from tasks.observability import tracing
from tasks.worker.processes import WorkerGroup, free_port

GOAL = ">= 0.95x"
MODES = ("off", "metrics", "otel", "metrics+otel", "off-again")
# Two groups without either, first and last: A/A runs showed worker groups of one mode
# differing by up to ~20% by their place alone; the baseline sums both.
OFF = ("off", "off-again")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class _Drop(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that answers 200 to every export and keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()


def _overrides(label: str, url: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "metrics" in label:
        values.update(metrics_port=free_port(), metrics_addr="127.0.0.1")
    if "otel" in label:
        values.update(otel=True, otlp_traces_endpoint=url)
    return values


def _cpu_s(group: WorkerGroup) -> float:
    """CPU seconds (user + system) the group's main processes and pool children used."""
    total = 0.0
    for pid in group.pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    return total


def observability(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s every_phase with metrics on, OTel on, and both, vs both off (goal >= 0.95x
    each), and the workers' CPU ms per turn; the modes' workers up at once, taking turns
    batch by batch."""
    batch_sessions, per = sized(10, scale, 3), 3
    rounds = sized(12, scale, 3)
    elapsed = dict.fromkeys(MODES, 0.0)
    cpu = dict.fromkeys(MODES, 0.0)
    turns = dict.fromkeys(MODES, 0)
    # This process sends without tracing in every mode (its tracer is per process): what
    # is compared is the workers' cost.
    tracing.forget()
    tracing.tracer(harness.bench_settings())
    with _receiver() as url, ExitStack() as stack:
        # A spare group, started first and never measured: in an A/A run (two identical
        # modes) the group started first came out ~20% slower, whatever its mode.
        spare = harness.bench_settings()
        stack.enter_context(harness.workers(spare, **SHAPE))
        rows.send_turns(AgentClient(spare), f"spare-{uuid.uuid4().hex[:6]}", 4, 2)
        groups: dict[str, tuple[AgentClient, WorkerGroup]] = {}
        for label in MODES:
            settings = harness.bench_settings(**_overrides(label, url))
            group = stack.enter_context(harness.workers(settings, **SHAPE))
            client = AgentClient(settings)
            rows.send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
            groups[label] = (client, group)
        for round_ in range(rounds):
            shift = round_ % len(MODES)
            for label in MODES[shift:] + MODES[:shift]:
                client, group = groups[label]
                before_cpu, started = _cpu_s(group), time.perf_counter()
                rows.send_turns(client, f"obs-{uuid.uuid4().hex[:8]}", batch_sessions, per)
                elapsed[label] += time.perf_counter() - started
                cpu[label] += _cpu_s(group) - before_cpu
                turns[label] += batch_sessions * per
        for label in MODES:
            harness.say(
                f"{label}: {turns[label] / elapsed[label]:.1f} turns/s, "
                f"{cpu[label] * 1000 / turns[label]:.1f} worker CPU ms/turn"
            )
    tracing.forget()
    rate = {label: turns[label] / elapsed[label] for label in MODES}
    ms = {label: cpu[label] * 1000 / turns[label] for label in MODES}
    rate["off"] = sum(turns[o] for o in OFF) / sum(elapsed[o] for o in OFF)
    ms["off"] = sum(cpu[o] for o in OFF) * 1000 / sum(turns[o] for o in OFF)
    for label in MODES[1:-1]:
        table.append(
            Row(
                f"turns/s every_phase [{label} on]",
                rate[label],
                rate["off"],
                "turns/s",
                "off",
                target=GOAL,
            )
        )
    for label in MODES[1:-1]:
        table.append(
            Row(
                f"worker CPU per turn [{label} on]",
                ms[label],
                ms["off"],
                "ms",
                "off",
                higher_is_better=False,
                target="report",
            )
        )
    notes.append(
        f"observability: {rounds} rounds of {batch_sessions} sessions x {per} messages per "
        f"mode on {SHAPE_NAME} each, every mode's workers up at once and taking turns "
        "batch by batch (time and CPU summed over the batches; the baseline is two groups "
        "with both off, first and last); OTel spans go to a local receiver that drops "
        "them; the sending process does not trace."
    )
