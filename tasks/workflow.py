"""The workflow step task: claim, run the action, complete, dispatch what became ready."""

from __future__ import annotations

import logging
from typing import Any

from state.errors import StaleStateError
from tasks.app import app
from tasks.options import TASK_OPTIONS, with_retries
from tasks.runtime import runtime

logger = logging.getLogger(__name__)


@app.task(name="agentstate.workflow.step", **TASK_OPTIONS)
def step(self: Any, workflow_id: str, step_id: str, revision: int) -> dict[str, Any]:
    """Run one step of a workflow at ``revision`` (duplicates are dropped)."""
    try:
        status = with_retries(
            self,
            lambda: runtime().workflows.run_step(workflow_id, step_id, revision, self.request.id),
        )
    except StaleStateError as exc:
        logger.info("step %s/%s lost its claim: %s", workflow_id, step_id, exc)
        status = "stale"
    return {"workflow_id": workflow_id, "step_id": step_id, "status": status}
