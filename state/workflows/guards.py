"""The WHERE conditions of guarded step updates: every status change names the revision
it expects, so a duplicate delivery (or a racing writer) changes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from state import observe
from state.errors import StaleStateError
from state.storage.tables import steps
from state.workflow import WorkflowStepStatus
from state.workflows.records import PENDING_APPROVAL, ClaimedStep


def step_at(workflow_id: str, step_id: str, revision: int) -> tuple[Any, ...]:
    """The WHERE conditions that match a step at ``revision``."""
    return (
        steps.c.workflow_id == workflow_id,
        steps.c.step_id == step_id,
        steps.c.revision == revision,
    )


def awaiting(workflow_id: str, step_id: str) -> tuple[Any, ...]:
    """A step that waits for its approval decision."""
    return (
        steps.c.workflow_id == workflow_id,
        steps.c.step_id == step_id,
        steps.c.status == WorkflowStepStatus.PENDING,
        steps.c.approval == PENDING_APPROVAL,
    )


def claim_guard(claimed: ClaimedStep) -> Iterable[Any]:
    """The step still running under ``claimed``."""
    return (
        *step_at(claimed.workflow_id, claimed.step_id, claimed.revision),
        steps.c.status == WorkflowStepStatus.RUNNING,
    )


def unclaimed_guard(workflow_id: str, step_id: str, revision: int) -> tuple[Any, ...]:
    """The step still waiting to run at ``revision`` (a quick action's, never claimed)."""
    return (
        *step_at(workflow_id, step_id, revision),
        steps.c.status.in_((WorkflowStepStatus.PENDING, WorkflowStepStatus.RETRYING)),
    )


def require_one(rowcount: int, claimed: ClaimedStep) -> None:
    """Raise StaleStateError unless the claim's guarded update changed exactly one row."""
    if rowcount != 1:
        observe.current.commit_refused("step")
        raise StaleStateError(
            f"step {claimed.workflow_id}/{claimed.step_id} was taken over "
            f"(no longer at revision {claimed.revision})"
        )
