"""One task per FSM work phase (``agentstate.phase.<phase>``), all with the same thin
body, plus the durable execution-timeout check.

Each task hands its delivery to the turn engine (``state.turns.engine``); a delivery
that is a duplicate, or that lost a race to another writer, is dropped without effect.
"""

from __future__ import annotations

import time
from typing import Any

from state.machine import WORK_PHASES, Phase
from state.turns.draft import Delivery, PhaseOutcome
from tasks.app import app
from tasks.dispatch.dispatcher import PHASE_TASK, TIMEOUT_TASK
from tasks.observability import report, tracing
from tasks.worker.base import AgentStateTask
from tasks.worker.runtime import runtime


def _phase_task(phase: Phase) -> Any:
    name = PHASE_TASK.format(phase)

    def run_phase(
        self: AgentStateTask,
        session_id: str,
        revision: int | None = None,
        carried: str | None = None,
    ) -> Any:
        started = time.perf_counter()
        delivery = Delivery(
            phase,
            session_id,
            revision,
            self.request.id,
            not self.repeated,
            self.redelivered,
            carried,
        )
        with tracing.task_span(
            name, self.request, **{"agentstate.session_id": session_id, "agentstate.phase": phase}
        ):
            outcome = self.attempt(
                lambda: runtime().turns.run_phase(delivery),
                lambda _exc: PhaseOutcome(session_id, "stale"),
            )
            return report.phase_finished(phase, started, outcome)

    run_phase.__name__ = run_phase.__qualname__ = phase.value
    run_phase.__doc__ = (
        f"Run the {phase} phase of a session's turn at ``revision`` (from the snapshot "
        "``carried``, if any: untrusted, its commit checks it against the row)."
    )
    return app.task(name=name, base=AgentStateTask, bind=True)(run_phase)


PHASE_TASKS = {phase: _phase_task(phase) for phase in WORK_PHASES}


@app.task(name=TIMEOUT_TASK, base=AgentStateTask, bind=True)
def execution_timeout(self: AgentStateTask, session_id: str, deadline: float) -> Any:
    """Fire ``timeout`` if the session is still executing under this deadline."""
    with tracing.task_span(TIMEOUT_TASK, self.request, **{"agentstate.session_id": session_id}):
        outcome = self.attempt(
            lambda: runtime().turns.interventions.fire_timeout(session_id, deadline),
            lambda _exc: PhaseOutcome(session_id, "stale"),
        )
        return report.timeout_fired(outcome)
