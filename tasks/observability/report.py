"""What each agentstate task reports when it ends: its metrics, and for work that ended
failed, the error that makes Celery (and Flower) show the task as FAILURE.

Off (no metrics port, no OTel) a task pays a check of two module globals.
"""

from __future__ import annotations

import time

from state.errors import WorkFailedError
from state.turns.draft import PhaseOutcome
from state.workflows.calls import StepFailed
from tasks.observability import metrics


def phase_finished(phase: str, started: float, outcome: PhaseOutcome) -> dict[str, object]:
    """Count the phase task (``started``: its ``time.perf_counter()`` at start); its
    result, or WorkFailedError if its turn ended with an apology."""
    counting = metrics.active()
    if counting is not None:
        counting.phase_done(phase, time.perf_counter() - started, outcome.turn)
    _raise_if_failed(outcome)
    return outcome.as_dict()


def timeout_fired(outcome: PhaseOutcome) -> dict[str, object]:
    """The execution-timeout task's report (an ended turn counts as a phase's does)."""
    counting = metrics.active()
    if counting is not None and outcome.turn is not None:
        counting.turn_ended(outcome.turn)
    _raise_if_failed(outcome)
    return outcome.as_dict()


def step_finished(workflow_id: str, step_id: str, status: str) -> dict[str, object]:
    """Count the step task; its result, or WorkFailedError if the step ended failed."""
    counting = metrics.active()
    if counting is not None:
        counting.step_done(str(status))
    if isinstance(status, StepFailed):
        raise WorkFailedError(f"step {workflow_id}/{step_id} failed: {status.error}")
    return {"workflow_id": workflow_id, "step_id": step_id, "status": str(status)}


def _raise_if_failed(outcome: PhaseOutcome) -> None:
    if outcome.turn == "failed":
        raise WorkFailedError(
            f"session {outcome.session_id}: the turn ended with an apology: {outcome.error}"
        )
