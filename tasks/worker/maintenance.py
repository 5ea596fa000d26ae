"""Periodic tasks run by ``celery -A tasks beat``: the recovery sweep, session expiry,
approval expiry and retention (events, revisions, sessions, workflows)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from state.clock import utcnow
from state.lifecycle.retention import prune_all
from state.recovery.queries import expire_idle_sessions
from tasks.app import app
from tasks.worker.base import AgentStateTask, stale_result
from tasks.worker.runtime import runtime

SWEEP_TASK = "agentstate.recovery.sweep"
EXPIRE_TASK = "agentstate.session.expire_idle"
PRUNE_TASK = "agentstate.events.prune"
EXPIRE_APPROVALS_TASK = "agentstate.approvals.expire"


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


@app.task(name=PRUNE_TASK, base=AgentStateTask, bind=True)
def prune_events(self: AgentStateTask) -> Any:
    """Retention (``state.lifecycle.retention``): events and revision records past
    AGENTSTATE_EVENTS_RETAIN_DAYS, sessions and workflows past theirs, all that is due, in
    short batches (a session's current state is kept)."""
    rt = runtime()
    return self.attempt(
        lambda: prune_all(rt.backend.engine, rt.backend.redis, rt.backend.settings),
        stale_result(),
    )


@app.task(name=EXPIRE_APPROVALS_TASK, base=AgentStateTask, bind=True)
def expire_approvals(self: AgentStateTask) -> Any:
    """Reject the approvals nobody decided by their ``expires_at`` (``by == "expired"``):
    a turn waiting for one goes on to its reply, a step waiting for one fails."""
    return {"expired": self.attempt(runtime().approvals.expire_due, lambda _exc: 0)}
