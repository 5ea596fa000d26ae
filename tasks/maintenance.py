"""Periodic tasks run by ``celery -A tasks beat``: the recovery sweep and session expiry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from state.clock import utcnow
from state.recovery.queries import expire_idle_sessions
from tasks.app import app
from tasks.base import AgentStateTask, stale_result
from tasks.runtime import runtime

SWEEP_TASK = "agentstate.recovery.sweep"
EXPIRE_TASK = "agentstate.session.expire_idle"


@app.task(name=SWEEP_TASK, base=AgentStateTask, bind=True)
def sweep(self: AgentStateTask) -> Any:
    """Re-enqueue lost work (sessions, inbox messages, workflow steps)."""
    return self.attempt(lambda: runtime().recovery.run().as_dict(), stale_result())


@app.task(name=EXPIRE_TASK, base=AgentStateTask, bind=True)
def expire_idle(self: AgentStateTask) -> Any:
    """Mark sessions idle past AGENTSTATE_SESSION_TTL as timed out."""
    rt = runtime()
    cutoff = utcnow() - timedelta(seconds=rt.backend.settings.session_ttl)
    return {
        "expired": self.attempt(
            lambda: expire_idle_sessions(rt.backend.engine, cutoff), lambda _exc: 0
        )
    }
