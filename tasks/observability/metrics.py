"""Prometheus metrics of workers and of ``agentstate serve``.

Workers (AGENTSTATE_METRICS_PORT > 0) run prometheus-client in multiprocess mode: each
pool child adds to counters in memory-mapped files of its own (one ``struct`` write per
increment, under an uncontended lock: no thread, no I/O, no Redis or database call on a
phase's path), and the worker's main process, which runs no task, serves their sum over
HTTP. Labels are bounded sets (phases, outcomes, statuses), never ids.

Gauges of work that waits (queued messages, undecided approvals, steps held back for
their fair share) are read from the database when scraped, at most every
GAUGE_CACHE_S, by whoever serves the endpoint.

A turn cancelled from a process that serves no metrics (the CLI, an app's client) is
left in Redis (``MailboxObserver``): the next scrape of any worker or ``agentstate
serve`` takes it with GETDEL and counts it there, so it is counted once, fleet-wide.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import redis

from config import Settings
from state import observe
from state.gauges import Waiting, waiting
from state.storage import keys

__all__ = ["Metrics", "Waiting", "WaitingCollector", "active", "render", "serve_registry"]
from state.machine import WORK_PHASES

logger = logging.getLogger(__name__)

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own
GAUGE_CACHE_S = 5.0
SHM = "/dev/shm"  # noqa: S108 - mkdtemp makes a private (0700), unguessable directory there
# Phases take milliseconds to (executing, with its tools) minutes.
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LOCK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
TURN_OUTCOMES = ("replied", "failed", "cancelled")
STEP_STATUSES = ("success", "failed", "retrying", "duplicate", "stale", "waiting", "resumed")
REFUSED = ("session", "lock_lost", "step")
WEBHOOK_OUTCOMES = ("delivered", "retrying", "failed", "stale")


class Metrics:
    """The counters and histograms of one process (an ``observe.Observer`` too)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import Counter, Histogram

        kw: dict[str, Any] = {"registry": registry}
        self.turns = Counter(
            "agentstate_turns_total", "Turns ended, by outcome.", ["outcome"], **kw
        )
        self.phase_seconds = Histogram(
            "agentstate_phase_seconds",
            "Seconds a phase task ran, by the phase delivered.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            **kw,
        )
        self.steps = Counter(
            "agentstate_steps_total",
            "Workflow step deliveries, by what became of them.",
            ["status"],
            **kw,
        )
        self.recoveries = Counter(
            "agentstate_recoveries_total",
            "Lost or stuck work taken up again (sweeps and broker redeliveries).",
            **kw,
        )
        self.lock_wait = Histogram(
            "agentstate_lock_wait_seconds",
            "Seconds a phase waited for its session's lock.",
            buckets=LOCK_BUCKETS,
            **kw,
        )
        self.refused = Counter(
            "agentstate_commits_refused_total",
            "Guarded commits refused (fencing: a stale or lock-less writer), by kind.",
            ["kind"],
            **kw,
        )
        self.sweeps = Counter("agentstate_sweeps_total", "Recovery sweeps run.", **kw)
        self.sweep_items = Counter(
            "agentstate_sweep_items_total",
            "What recovery sweeps did, by action.",
            ["action"],
            **kw,
        )
        self.schedule_ticks = Counter(
            "agentstate_schedule_ticks_total",
            "Schedule ticks, by what became of them (fired or skipped).",
            ["status"],
            **kw,
        )
        self.webhook_attempts = Counter(
            "agentstate_webhook_attempts_total",
            "Webhook delivery attempts, by outcome.",
            ["outcome"],
            **kw,
        )
        # Children resolved once: a labels() call per event would take a lock and a dict
        # lookup on the phase path.
        self._phases = {str(p): self.phase_seconds.labels(phase=str(p)) for p in WORK_PHASES}
        self._turns = {o: self.turns.labels(outcome=o) for o in TURN_OUTCOMES}
        self._steps = {s: self.steps.labels(status=s) for s in STEP_STATUSES}
        self._refused = {k: self.refused.labels(kind=k) for k in REFUSED}

    # -- what tasks report ---------------------------------------------------------

    def phase_done(self, phase: str, seconds: float, turn: str | None) -> None:
        """A phase task finished (``turn``: how the turn ended in it, if it did)."""
        child = self._phases.get(phase)
        if child is not None:
            child.observe(seconds)
        if turn is not None:
            self._turn(turn)

    def turn_ended(self, outcome: str) -> None:
        """A turn ended outside a phase task (the execution timeout's)."""
        self._turn(outcome)

    def step_done(self, status: str) -> None:
        """A step task finished with ``status``."""
        child = self._steps.get(status)
        (child or self.steps.labels(status="other")).inc()

    def _turn(self, outcome: str) -> None:
        child = self._turns.get(outcome)
        (child or self.turns.labels(outcome="other")).inc()

    # -- observe.Observer ----------------------------------------------------------

    def lock_waited(self, seconds: float) -> None:
        self.lock_wait.observe(seconds)

    def commit_refused(self, what: str) -> None:
        child = self._refused.get(what)
        (child or self.refused.labels(kind="other")).inc()

    def recovered(self, what: str, count: int = 1) -> None:
        self.recoveries.inc(count)

    def swept(self, counts: Mapping[str, int], recovered: int) -> None:
        self.sweeps.inc()
        for action, count in counts.items():
            if count:
                self.sweep_items.labels(action=action).inc(count)
        if recovered:
            self.recoveries.inc(recovered)

    def ticked(self, fired: int, skipped: int) -> None:
        if fired:
            self.schedule_ticks.labels(status="fired").inc(fired)
        if skipped:
            self.schedule_ticks.labels(status="skipped").inc(skipped)

    def webhook_attempted(self, outcome: str) -> None:
        label = outcome if outcome in WEBHOOK_OUTCOMES else "other"
        self.webhook_attempts.labels(outcome=label).inc()


class MailboxObserver(observe.NullObserver):
    """The observer of a process that serves no metrics: a turn it ends (a cancel) is
    left in Redis for a process that does (no I/O on any hot path: cancels only)."""

    def __init__(self, redis_client: Any) -> None:
        self.redis = redis_client

    def turn_ended(self, outcome: str) -> None:
        key = keys.unscraped_turns(outcome if outcome in TURN_OUTCOMES else "other")
        try:
            self.redis.incr(key)
        except redis.RedisError as exc:  # a count is not worth failing a cancel for
            logger.warning("metrics: could not leave a %s turn to be counted: %r", outcome, exc)


def count_elsewhere(redis_client: Any) -> None:
    """In a process that serves no metrics (the CLI, an app), have the turns it ends
    counted by the next worker or ``agentstate serve`` scraped."""
    if active() is None and isinstance(observe.current, observe.NullObserver):
        observe.install(MailboxObserver(redis_client))


class MailboxCollector:
    """At each scrape, moves the turns other processes left in Redis into this
    endpoint's counters (GETDEL: each is taken by one endpoint only)."""

    def __init__(self, connect: Callable[[], Any], counting: Callable[[], Metrics | None]):
        self._connect = connect
        self._counting = counting
        self._client: Any = None

    def collect(self) -> Iterator[Any]:
        metrics = self._counting()
        if metrics is None:
            return iter(())
        try:
            self._client = self._client or self._connect()
            pipe = self._client.pipeline(transaction=False)
            for outcome in (*TURN_OUTCOMES, "other"):
                pipe.getdel(keys.unscraped_turns(outcome))
            taken = pipe.execute()
        except redis.RedisError as exc:  # a scrape must answer even if Redis does not
            logger.warning("metrics: could not take the turns left to count: %r", exc)
            return iter(())
        for outcome, count in zip((*TURN_OUTCOMES, "other"), taken, strict=True):
            if count:
                metrics.turns.labels(outcome=outcome).inc(int(count))
        return iter(())


class WaitingCollector:
    """Gauges of work that waits, read from the database when scraped (cached briefly so
    that several scrapers cost one read)."""

    def __init__(self, read: Callable[[], Waiting]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._cached: tuple[float, Waiting | None] = (0.0, None)

    def _current(self) -> Waiting | None:
        with self._lock:
            at, value = self._cached
            if value is None or time.monotonic() - at > GAUGE_CACHE_S:
                try:
                    value = self._read()
                except Exception as exc:  # a scrape must answer even if the database does not
                    logger.warning("metrics: could not read waiting work: %r", exc)
                    return value
                self._cached = (time.monotonic(), value)
            return value

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        value = self._current()
        if value is None:
            return
        for name, doc, number in (
            ("agentstate_inbox_depth", "Messages queued for their turn.", value.inbox_depth),
            ("agentstate_approvals_pending", "Approvals not decided yet.", value.approvals_pending),
            (
                "agentstate_approval_oldest_age_seconds",
                "Age of the oldest undecided approval.",
                value.oldest_approval_age_s,
            ),
            (
                "agentstate_steps_waiting_fair_share",
                "Ready steps held back in the database for their user's fair share.",
                value.steps_waiting,
            ),
            (
                "agentstate_schedules_active",
                "Schedules that tick (not paused).",
                value.schedules_active,
            ),
            (
                "agentstate_webhook_deliveries_pending",
                "Webhook deliveries waiting to be sent or retried.",
                value.deliveries_pending,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=number)


# -- this process's metrics ----------------------------------------------------------

_active: tuple[int, Metrics | None] | None = None


def active() -> Metrics | None:
    """This process's metrics if it counts (a worker with AGENTSTATE_METRICS_PORT set, or
    ``agentstate serve``), else None. Built on first use in each process."""
    current = _active
    if current is not None and current[0] == os.getpid():
        return current[1]
    return _decide()


def _decide() -> Metrics | None:
    global _active  # noqa: PLW0603 - one set of metrics per process
    # Set by the worker's main process (start_worker_endpoint) for its pool children.
    if os.environ.get(MULTIPROC_VARIABLE):
        return _start_counting()
    _active = (os.getpid(), None)
    return None


def _start_counting(registry: Any = None) -> Metrics:
    global _active  # noqa: PLW0603 - one set of metrics per process
    from prometheus_client import values

    if os.environ.get(MULTIPROC_VARIABLE) and values.ValueClass.__name__ != "MmapedValue":
        # prometheus_client was imported before the directory was set: count in files.
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    metrics = Metrics(registry)
    _active = (os.getpid(), metrics)
    observe.install(metrics)
    return metrics


def start_worker_endpoint(settings: Settings) -> str | None:
    """In a worker's main process, before its pool starts: a fresh directory for the
    children's counters (inherited through the environment), and the HTTP endpoint on
    AGENTSTATE_METRICS_PORT summing them; the directory's path (None: metrics off)."""
    if not settings.metrics_port:
        return None
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    # Memory, not disk: the counters' pages need never be written back.
    shm = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
    path = tempfile.mkdtemp(prefix="agentstate-metrics-", dir=shm)
    os.environ[MULTIPROC_VARIABLE] = path  # for this process's children (prometheus' own)
    registry = CollectorRegistry()
    # Its own counters (files in the directory, summed with the children's) hold what it
    # takes from Redis at a scrape, before the sum is read.
    own = _start_counting()
    connect = partial(redis.Redis.from_url, settings.redis_url, socket_timeout=2.0)
    registry.register(MailboxCollector(connect, lambda: own))
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    registry.register(WaitingCollector(_database_reader(settings)))
    start_http_server(settings.metrics_port, addr=settings.metrics_addr, registry=registry)
    logger.info("metrics on %s:%d/metrics", settings.metrics_addr, settings.metrics_port)
    return path


def stop_worker_endpoint(path: str | None) -> None:
    """At the worker's shutdown: drop the children's counter files."""
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _database_reader(settings: Settings) -> Callable[[], Waiting]:
    # The main process keeps no connection open: a child forked later must not inherit
    # one (a scrape every few seconds can afford to connect).
    def read() -> Waiting:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        engine = create_engine(settings.database_url, poolclass=NullPool)
        try:
            return waiting(engine)
        finally:
            engine.dispose()

    return read


def serve_registry(read: Callable[[], Waiting], redis_client: Any = None) -> Any:
    """The registry ``agentstate serve`` renders at ``/metrics``: its own process's
    counters (with the turns other processes left in ``redis_client`` to count) and the
    gauges of waiting work."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    if redis_client is not None:
        registry.register(MailboxCollector(lambda: redis_client, active))
    registry.register(WaitingCollector(read))
    if _active is None or _active[0] != os.getpid() or _active[1] is None:
        _start_counting(registry)
    return registry


def render(registry: Any) -> tuple[bytes, str]:
    """The text exposition of ``registry`` and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST
