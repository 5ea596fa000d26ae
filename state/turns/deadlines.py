"""The durable execution timeout: a deadline stored with the session, watched by an
alarm while its handler runs and by the recovery sweep if its worker dies."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from state.dispatch import Dispatcher
from state.machine import Phase
from state.sessions.snapshot import Snapshot
from state.ticker import Ticker

_alarms = Ticker("deadline-alarms")


def deadline_passed(snap: Snapshot) -> bool:
    """Whether the session is executing past its stored deadline."""
    deadline = snap.deadline_at
    return snap.phase == Phase.EXECUTING and deadline is not None and time.time() > deadline


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
