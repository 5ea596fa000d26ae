"""Periodic tasks run by ``celery -A tasks beat``: the recovery sweep and session expiry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from state.recovery.queries import expire_idle_sessions
from state.session import utcnow
from tasks.app import app
from tasks.options import TASK_OPTIONS, with_retries
from tasks.runtime import runtime


@app.task(name="agentstate.recovery.sweep", **TASK_OPTIONS)
def sweep(self: Any) -> dict[str, int]:
    """Re-enqueue lost work (sessions, inbox messages, workflow steps)."""

    def sweep_once() -> Any:
        return runtime().recovery.run()

    return dict(with_retries(self, sweep_once).as_dict())


@app.task(name="agentstate.session.expire_idle", **TASK_OPTIONS)
def expire_idle(self: Any) -> dict[str, int]:
    """Mark sessions idle past AGENTSTATE_SESSION_TTL as timed out."""
    rt = runtime()
    cutoff = utcnow() - timedelta(seconds=rt.backend.settings.session_ttl)
    return {"expired": with_retries(self, lambda: expire_idle_sessions(rt.backend.engine, cutoff))}
