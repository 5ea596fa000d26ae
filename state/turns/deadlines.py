"""Time limits of handlers. The execution timeout is durable: a deadline stored with the
session, watched by an alarm while its handler runs and by the recovery sweep if its worker
dies. The phase time limit (AGENTSTATE_PHASE_TIME_LIMIT) of the other handlers is watched
in their worker's process, by a watchdog thread that ends the turn if the handler does not
return in time."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from state.dispatch import Dispatcher
from state.machine import Phase
from state.sessions.snapshot import Snapshot
from state.ticker import Ticker

logger = logging.getLogger(__name__)

_alarms = Ticker("deadline-alarms")
# Its own thread: a ring commits to the database, and must not delay lock renewals.
_watchdog = Ticker("phase-time-limits")
_WATCH_PERIOD_S = 1.0


def deadline_passed(snap: Snapshot, grace_s: float = 0.0) -> bool:
    """Whether the session is executing past its stored deadline (plus ``grace_s``)."""
    deadline = snap.deadline_at
    return (
        snap.phase == Phase.EXECUTING and deadline is not None and time.time() > deadline + grace_s
    )


@contextmanager
def alarm(snap: Snapshot, dispatcher: Dispatcher) -> Iterator[None]:
    """While an executing handler runs, enqueue the deadline check when it is due.

    Scheduling a countdown task for every turn would park one message per turn in a
    worker's memory for the whole timeout; most handlers finish long before it. If
    this worker dies instead, the recovery sweep checks the stored deadline.
    """
    deadline = snap.deadline_at
    if snap.phase != Phase.EXECUTING or deadline is None:
        yield
        return
    key = ring_at(snap.session_id, deadline, dispatcher)
    try:
        yield
    finally:
        _alarms.unregister(key)


def ring_at(session_id: str, deadline: float, dispatcher: Dispatcher) -> str:
    """Enqueue the deadline check when ``deadline`` comes; return the alarm's key.

    A turn waiting on its workflow is watched this way too: a countdown task would outlive
    a workflow that finishes first and sit in the broker until the deadline. If this
    process dies, the recovery sweep enforces the stored deadline.
    """
    key = f"deadline:{session_id}:{deadline}"

    def ring() -> bool:
        dispatcher.timeout(session_id, deadline, 0.0)
        return False  # once

    _alarms.register(key, max(0.0, deadline - time.time()), ring)
    return key


@dataclass
class _Watched:
    due: float
    period_s: float
    ring: Callable[[], bool]


class _Watchdog:
    """One long-lived ticker entry per process that looks at the running handlers, so that
    starting and finishing a handler cost a dict update, not a wake-up of a thread."""

    def __init__(self) -> None:
        self.running: dict[str, _Watched] = {}
        self.guard = threading.Lock()
        self.pid = 0

    def watch(self, key: str, limit_s: float, ring: Callable[[], bool]) -> None:
        with self.guard:
            if self.pid != os.getpid():
                self.pid = os.getpid()
                self.running.clear()
                period = min(_WATCH_PERIOD_S, limit_s / 4)
                _watchdog.register("phase-time-limits", period, self.look)
            self.running[key] = _Watched(time.monotonic() + limit_s, limit_s, ring)

    def forget(self, key: str) -> None:
        with self.guard:
            self.running.pop(key, None)

    def look(self) -> bool:
        now = time.monotonic()
        with self.guard:
            due = [(key, w) for key, w in self.running.items() if w.due <= now]
        for key, watched in due:
            try:
                again = watched.ring()
            except Exception:
                logger.exception("ending the overrun run %s failed; trying again later", key)
                again = True
            with self.guard:
                if self.running.get(key) is watched:
                    if again:
                        watched.due = time.monotonic() + watched.period_s
                    else:
                        del self.running[key]
        return True


_running = _Watchdog()


@contextmanager
def time_limit(key: str, limit_s: float, ring: Callable[[], bool]) -> Iterator[None]:
    """While the block runs, call ``ring`` (from this process's watchdog thread) once it
    has run longer than ``limit_s``, and every ``limit_s`` after that while ``ring``
    returns True (it failed and should be tried again). ``key`` names this one run."""
    _running.watch(key, limit_s, ring)
    try:
        yield
    finally:
        _running.forget(key)
