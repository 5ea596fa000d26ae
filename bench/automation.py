"""Benchmarks of schedules and webhooks.

- ticks/s: schedules all due at once (1,000 at full size), fired by one look of the clock
  (``ScheduleClock.run``, what beat's task runs: each tick its guarded row, its message
  accepted, in batches under ``SKIP LOCKED``), vs the same number of plain accepts
  (``Inbox.accept``, a message each, no schedule); the p99 delay from a tick's time to its
  commit is printed.
- webhook deliveries/s: deliveries written to the outbox at once, claimed and handed to
  real workers that sign and POST them to a local receiver, vs the same POSTs sent one
  after another by one thread of the bench; the p99 from the event to its receipt is
  printed.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import insert

from bench import harness
from bench.harness import say
from bench.rows import Row
from bench.suite import SHAPE, sized
from config import Settings
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.documents import codec
from state.schedules.ticks import ScheduleClock, TickRules
from state.sessions.inbox import Inbox
from state.storage.backend import Backend
from state.storage.tables_automation import schedules
from state.webhooks.courier import Courier
from state.webhooks.hooks import HookStore
from state.webhooks.outbox import WebhookEvent, enqueue
from tasks.dispatch.dispatcher import CeleryDispatcher


def ticks(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Ticks fired/s with every schedule due at once, vs plain accepts/s."""
    count = sized(1000, scale, 10)
    settings = harness.bench_settings()
    backend = Backend.build(settings)
    tag = uuid.uuid4().hex[:6]
    _due_schedules(backend, tag, count)
    clock = ScheduleClock(backend.engine, TickRules.from_settings(settings))
    started = time.perf_counter()
    report = clock.run(RecordingDispatcher(), _NoRoots(), budget_s=600.0)
    ours = report.fired / (time.perf_counter() - started)
    inbox = Inbox.for_engine(backend.engine, backend.statements)
    started = time.perf_counter()
    for i in range(count):
        inbox.accept(f"plain-{tag}-{i}", "bench-user", "tick")
    plain = count / (time.perf_counter() - started)
    p99 = harness.percentile(report.delays, 99) if report.delays else float("nan")
    say(f"{report.fired} ticks fired at {ours:,.0f}/s (p99 delay {p99 * 1000:.0f} ms)")
    notes.append(
        f"ticks: {count} schedules due at once fired by one look at {ours:,.0f}/s; a tick's "
        f"delay from its time to its commit p99 {p99 * 1000:.0f} ms"
    )
    table.append(
        Row(
            f"schedule ticks/s, {count} due at once",
            ours,
            plain,
            "ticks/s",
            "plain accepts/s",
            target="report",
        )
    )


def _due_schedules(backend: Backend, tag: str, count: int) -> None:
    now = utcnow()
    rows = [
        {
            "schedule_id": f"bench-{tag}-{i}",
            "user_id": "bench-user",
            "cron": None,
            "every_seconds": 3600.0,
            "timezone": "UTC",
            "target_session_id": f"tick-{tag}-{i}",
            "text": "tick",
            "workflow": None,
            "payload": "{}",
            "catch_up": "latest",
            "overlap": "enqueue",
            "paused": False,
            "next_tick": now - timedelta(seconds=1),
            "created_at": now,
            "updated_at": now,
        }
        for i in range(count)
    ]
    with backend.engine.begin() as conn:
        conn.execute(insert(schedules), rows)


class _NoRoots:
    def dispatch_roots(self, wf: Any, roots: Any) -> None:
        """No workflow in this row."""


def webhooks(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Deliveries/s through workers to a local receiver, vs plain POSTs/s."""
    count = sized(500, scale, 5)
    receiver = _Receiver().start()
    settings = harness.bench_settings(webhook_allow_private=True)
    try:
        with harness.workers(settings, **SHAPE):
            ours, p99 = _deliver(settings, receiver, count)
        plain = _plain_posts(receiver, count)
    finally:
        receiver.stop()
    say(f"{count} deliveries at {ours:,.1f}/s (p99 event to receipt {p99 * 1000:.0f} ms)")
    notes.append(
        f"webhooks: {count} deliveries through workers at {ours:,.1f}/s, p99 from the event "
        f"to its receipt {p99 * 1000:.0f} ms (a look every AGENTSTATE_TICK_INTERVAL: here "
        "the bench looks every 50 ms)"
    )
    table.append(
        Row(
            "webhook deliveries/s to a local receiver",
            ours,
            plain,
            "deliveries/s",
            "plain POSTs/s from one thread",
            target="report",
        )
    )


def _deliver(settings: Settings, receiver: _Receiver, count: int) -> tuple[float, float]:
    backend = Backend.build(settings)
    HookStore(backend.engine).add(
        receiver.url, [WebhookEvent.SCHEDULE_FIRED.value], allow_private=True
    )
    courier = Courier.build(backend.engine, settings)
    from tasks.app import make_app

    dispatcher = CeleryDispatcher(make_app(settings))
    started = time.perf_counter()
    with backend.engine.begin() as conn:
        for i in range(count):
            enqueue(conn, WebhookEvent.SCHEDULE_FIRED, None, {"n": i, "at": time.time()})
    while receiver.count() < count:
        for delivery_id, claim in courier.due(500):
            dispatcher.webhook(delivery_id, claim)
        if time.perf_counter() - started > 600:
            raise TimeoutError(f"{receiver.count()} of {count} deliveries arrived")
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    return count / elapsed, harness.percentile(receiver.delays(), 99)


def _plain_posts(receiver: _Receiver, count: int) -> float:
    body = codec.dumps({"type": "plain", "data": {"at": time.time()}}).encode()
    started = time.perf_counter()
    for _ in range(count):
        request = urllib.request.Request(receiver.url, data=body, method="POST")
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
    return count / (time.perf_counter() - started)


class _Receiver:
    """Counts POSTs and how long each took from the event its body tells."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delays: list[float] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> _Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                at = codec.loads(body).get("data", {}).get("at")
                with outer._lock:
                    outer._delays.append(time.time() - at if at else 0.0)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def count(self) -> int:
        with self._lock:
            return len(self._delays)

    def delays(self) -> list[float]:
        with self._lock:
            return list(self._delays)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
