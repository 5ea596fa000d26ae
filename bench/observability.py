"""The cost of what operators see: turns/s with Prometheus metrics on
(AGENTSTATE_METRICS_PORT) and with OpenTelemetry on (AGENTSTATE_OTEL, spans to a local
OTLP receiver that accepts and drops them) vs both off, on the same worker shape, warm.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench import harness, rows
from bench.harness import say
from bench.rows import Row
from bench.suite import SHAPE, SHAPE_NAME, sized, turns_of
from config import Settings
from tasks.observability import tracing
from tasks.worker.processes import free_port

GOAL = ">= 0.95x"


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


def observability(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s every_phase with metrics on, OTel on, and both, vs both off (goal >= 0.95x
    each), in :data:`bench.suite.SHAPE`, the modes taking turns round by round (the
    order rotating), the best round of each reported."""
    sessions, per = turns_of(scale)
    best: dict[str, float] = {}
    with _receiver() as url:
        modes = {
            "off": {},
            "metrics": {"metrics_port": 0},  # a free port, chosen per worker start
            "otel": {"otel": True, "otlp_traces_endpoint": url},
            "metrics+otel": {"metrics_port": 0, "otel": True, "otlp_traces_endpoint": url},
        }
        order = list(modes)
        for round_ in range(sized(4, scale, 2)):
            # Each mode takes each place in the order in turn: on a shared machine the
            # first measurement after a start is not the same as the third.
            shift = round_ % len(order)
            for label in order[shift:] + order[:shift]:
                overrides = modes[label]
                ours = _turns_per_second(overrides, sessions, per)
                say(f"{label}: {ours:.1f} turns/s")
                best[label] = max(best.get(label, 0.0), ours)
    off = best["off"]
    for label in ("metrics", "otel", "metrics+otel"):
        table.append(
            Row(
                f"turns/s every_phase [{label} on]", best[label], off, "turns/s", "off", target=GOAL
            )
        )
    notes.append(
        f"observability: {sessions} sessions x {per} messages per mode on {SHAPE_NAME}, the "
        "best of the rounds; OTel spans go to a local receiver that drops them (the client "
        "process traces send_message too)."
    )


def _turns_per_second(overrides: dict[str, Any], sessions: int, per: int) -> float:
    values = dict(overrides)
    if "metrics_port" in values:
        values.update(metrics_port=free_port(), metrics_addr="127.0.0.1")
    settings: Settings = harness.bench_settings(**values)
    tracing.forget()  # this process's client follows the mode's settings
    try:
        with harness.workers(settings, **SHAPE):
            return rows.turns_per_second(settings, sessions, per)
    finally:
        tracing.forget()
