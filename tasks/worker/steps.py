"""The workflow step task: claim, run the action, complete, dispatch what became ready."""

from __future__ import annotations

from typing import Any

from tasks.app import app
from tasks.dispatch.dispatcher import STEP_TASK
from tasks.observability import report, tracing
from tasks.worker.base import AgentStateTask
from tasks.worker.runtime import runtime


@app.task(name=STEP_TASK, base=AgentStateTask, bind=True)
def step(
    self: AgentStateTask,
    workflow_id: str,
    step_id: str,
    revision: int,
    carried: str | None = None,
) -> Any:
    """Run one step of a workflow at ``revision`` (duplicates are dropped); ``carried``:
    the step as it was released (untrusted: its commit checks it against the row)."""
    attributes = {"agentstate.workflow_id": workflow_id, "agentstate.step_id": step_id}
    with tracing.task_span(STEP_TASK, self.request, **attributes):
        status = self.attempt(
            lambda: runtime().workflows.run_step(
                workflow_id,
                step_id,
                revision,
                self.request.id,
                redelivered=self.redelivered,
                carried=carried,
            ),
            lambda _lost_claim: "stale",
        )
        return report.step_finished(workflow_id, step_id, status)
