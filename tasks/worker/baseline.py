"""Bare Celery tasks that benchmarks and tests measure agentstate against.

They do what a task minimally does (no state, no lock, no database), on the same app,
broker, serializer and event settings as the agentstate tasks. Workers load them only
with AGENTSTATE_BASELINE_TASKS=true, and they touch only their own counters.
"""

from __future__ import annotations

import time
from typing import Any

from state.storage import keys
from tasks.app import app
from tasks.worker.guard import GUARD_STRATEGY


@app.task(name="agentstate.baseline.noop", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def noop(self: Any, counter: str | None = None) -> None:
    """Do nothing; count completions in Redis if a counter is named."""
    if counter:
        _redis().incr(keys.baseline_counter(counter))


@app.task(name="agentstate.baseline.hop", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def hop(self: Any, remaining: int, counter: str | None = None) -> None:
    """One hop of a bare chain: enqueue the next hop until none remain."""
    if remaining > 1:
        self.app.send_task("agentstate.baseline.hop", args=[remaining - 1, counter])
    elif counter:
        _redis().incr(keys.baseline_counter(counter))


@app.task(name="agentstate.baseline.stamp", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def stamp(self: Any, counter: str) -> None:
    """Record when this task ran (the last hop of a latency probe)."""
    _redis().set(keys.baseline_counter(counter), repr(time.time()), ex=3600)


def _redis() -> Any:
    from config import get_settings
    from state.storage.redis_client import get_redis

    return get_redis(get_settings().redis_url)
