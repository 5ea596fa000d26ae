"""One thin task per FSM work phase, plus the durable execution-timeout check.

Each task hands its delivery to the turn engine in ``state.turns.engine``; a delivery that is a
duplicate, or that lost a race to another writer, is dropped without effect.
"""

from __future__ import annotations

import logging
from typing import Any

from state.errors import StaleStateError
from tasks.app import app
from tasks.options import TASK_OPTIONS, with_retries
from tasks.runtime import runtime

logger = logging.getLogger(__name__)


def _run(task: Any, phase: str, session_id: str, revision: int | None) -> dict[str, Any]:
    request = task.request
    repeated = bool(request.retries) or bool((request.delivery_info or {}).get("redelivered"))

    def run() -> Any:
        return runtime().turns.run_phase(
            phase, session_id, revision, request.id, use_cache=not repeated
        )

    try:
        outcome = with_retries(task, run)
    except StaleStateError as exc:
        logger.info("session %s: %s lost a race and was dropped: %s", session_id, phase, exc)
        return {"session_id": session_id, "status": "stale", "phases": []}
    return dict(outcome.as_dict())


@app.task(name="agentstate.phase.understanding", **TASK_OPTIONS)
def understanding(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Start the next queued message's turn (if the session is resting) and understand it."""
    return _run(self, "understanding", session_id, revision)


@app.task(name="agentstate.phase.planning", **TASK_OPTIONS)
def planning(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Plan the turn."""
    return _run(self, "planning", session_id, revision)


@app.task(name="agentstate.phase.retrieving", **TASK_OPTIONS)
def retrieving(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Retrieve memory and context."""
    return _run(self, "retrieving", session_id, revision)


@app.task(name="agentstate.phase.executing", **TASK_OPTIONS)
def executing(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Call tools (or collect a finished workflow's results)."""
    return _run(self, "executing", session_id, revision)


@app.task(name="agentstate.phase.evaluating", **TASK_OPTIONS)
def evaluating(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Judge the tool results."""
    return _run(self, "evaluating", session_id, revision)


@app.task(name="agentstate.phase.generating", **TASK_OPTIONS)
def generating(self: Any, session_id: str, revision: int | None = None) -> dict[str, Any]:
    """Write the reply."""
    return _run(self, "generating", session_id, revision)


@app.task(name="agentstate.session.timeout", **TASK_OPTIONS)
def execution_timeout(self: Any, session_id: str, deadline: float) -> dict[str, Any]:
    """Fire ``timeout`` if the session is still executing under this deadline."""
    try:
        return with_retries(
            self, lambda: runtime().turns.fire_timeout(session_id, deadline)
        ).as_dict()
    except StaleStateError:
        return {"session_id": session_id, "status": "stale", "phases": []}
