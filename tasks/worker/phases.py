"""One task per FSM work phase (``agentstate.phase.<phase>``), all with the same thin
body, plus the durable execution-timeout check.

Each task hands its delivery to the turn engine (``state.turns.engine``); a delivery
that is a duplicate, or that lost a race to another writer, is dropped without effect.
"""

from __future__ import annotations

from typing import Any

from state.machine import WORK_PHASES, Phase
from state.turns.draft import Delivery
from tasks.app import app
from tasks.dispatch.dispatcher import PHASE_TASK, TIMEOUT_TASK
from tasks.worker.base import AgentStateTask, stale_result
from tasks.worker.runtime import runtime


def _phase_task(phase: Phase) -> Any:
    def run_phase(
        self: AgentStateTask,
        session_id: str,
        revision: int | None = None,
        carried: str | None = None,
    ) -> Any:
        delivery = Delivery(
            phase,
            session_id,
            revision,
            self.request.id,
            not self.repeated,
            self.redelivered,
            carried,
        )
        return self.attempt(
            lambda: runtime().turns.run_phase(delivery).as_dict(),
            stale_result(session_id=session_id, phases=[]),
        )

    run_phase.__name__ = run_phase.__qualname__ = phase.value
    run_phase.__doc__ = (
        f"Run the {phase} phase of a session's turn at ``revision`` (from the snapshot "
        "``carried``, if any: untrusted, its commit checks it against the row)."
    )
    return app.task(name=PHASE_TASK.format(phase), base=AgentStateTask, bind=True)(run_phase)


PHASE_TASKS = {phase: _phase_task(phase) for phase in WORK_PHASES}


@app.task(name=TIMEOUT_TASK, base=AgentStateTask, bind=True)
def execution_timeout(self: AgentStateTask, session_id: str, deadline: float) -> Any:
    """Fire ``timeout`` if the session is still executing under this deadline."""
    return self.attempt(
        lambda: runtime().turns.interventions.fire_timeout(session_id, deadline).as_dict(),
        stale_result(session_id=session_id, phases=[]),
    )
