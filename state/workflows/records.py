"""What WorkflowStore hands out (claims, completions) and how steps map to and from rows.

Split out of state.workflows.store (which re-exports them) to keep that module a readable size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from state.clock import iso
from state.documents import codec
from state.documents.codec import Document
from state.sessions.snapshot import CARRY_MAX_CHARS, carried_object
from state.workflow import WorkflowStatus, WorkflowStepStatus

Dispatch = tuple[str, int]  # (step_id, revision) of a step to run


# A step's ``approval`` column: NULL (none needed), then one of these.
PENDING_APPROVAL = "pending"
APPROVED = "approved"
REJECTED = "rejected"


@dataclass(frozen=True)
class ClaimedStep:
    """A step this worker now runs, at ``revision`` (its claim)."""

    workflow_id: str
    step_id: str
    revision: int
    action: str
    inputs: Document
    dependencies: list[str]
    retry_count: int
    max_retries: int
    task_id: str | None = None
    timeout_s: float | None = None
    dep_outputs: Document | None = None  # read with the claim when the backend can
    dependents: list[str] | None = None
    # The workflow's generation (``state.storage.generations``): what the step reads of
    # its workflow beyond its own row (the context) is read at this generation.
    generation: int = 0


@dataclass(frozen=True)
class Leftover:
    """Follow-ups of a delivery whose commit landed but whose acknowledgement was lost."""

    claimed: ClaimedStep | None = None
    retry_revision: int | None = None
    completion: Completion | None = None


@dataclass(frozen=True)
class Finished:
    """A workflow that just became finished, and the session waiting for it."""

    workflow_id: str
    status: str
    session_id: str | None
    resume_revision: int | None


@dataclass(frozen=True)
class Completion:
    """What a step's final status change set in motion."""

    workflow_id: str
    ready: list[Dispatch]
    finished: Finished | None
    # The action of each ready step, by step id, where the store read it with them.
    actions: dict[str, str] = field(default_factory=dict)
    # What each ready quick-runnable step runs from, by step id, as JSON (see
    # :func:`carried_step`), where the store read it with them: its message carries it.
    carried: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkflowProgress:
    """A workflow's status and counts without any payload: what a waiter reads."""

    workflow_id: str
    status: str
    total_steps: int
    remaining_steps: int
    failed_steps: int
    step_counts: dict[str, int] | None = None  # steps by status, when asked for

    @property
    def done(self) -> int:
        """Steps that reached a terminal status."""
        return self.total_steps - self.remaining_steps

    @property
    def finished(self) -> bool:
        """Whether the workflow will not change again."""
        return self.status in WorkflowStatus.finished()


def claimed_from_row(workflow_id: str, step_id: str, revision: int, row: Any) -> ClaimedStep:
    """A ClaimedStep at ``revision`` from a row holding the claim columns."""
    return ClaimedStep(
        workflow_id=workflow_id,
        step_id=step_id,
        revision=revision,
        action=row.action,
        inputs=codec.loads(row.inputs),
        dependencies=codec.loads(row.dependencies),
        retry_count=int(row.retry_count),
        max_retries=int(row.max_retries),
        timeout_s=row.timeout_s,
        generation=int(row.generation),
    )


def step_row(workflow_id: str, step: Any, now: Any, owner: str | None = None) -> Document:
    """The ``steps`` row of a new, pending step of ``owner``'s workflow."""
    return {
        "workflow_id": workflow_id,
        "owner": owner or "",
        "step_id": step.step_id,
        "step_name": step.step_name,
        "action": step.action,
        "status": WorkflowStepStatus.PENDING.value,
        "inputs": codec.dumps(step.inputs),
        "outputs": "{}",
        "dependencies": codec.dumps(step.dependencies),
        "dependents": codec.dumps(step.dependents),
        "remaining_deps": step.remaining_deps,
        "retry_count": 0,
        "max_retries": step.max_retries,
        "timeout_s": step.timeout_s,
        "not_before_s": step.not_before_s,
        "approval": PENDING_APPROVAL if step.approval else None,
        "revision": 0,
        "recoveries": 0,
        "updated_at": now,
    }


def step_document(row: Any) -> Document:
    """A step row as a JSON-ready dict."""
    return {
        "step_id": row.step_id,
        "step_name": row.step_name,
        "action": row.action,
        "status": row.status,
        "inputs": codec.loads(row.inputs),
        "outputs": codec.loads(row.outputs),
        "dependencies": codec.loads(row.dependencies),
        "retry_count": row.retry_count,
        "max_retries": row.max_retries,
        "timeout_s": row.timeout_s,
        "not_before_s": row.not_before_s,
        "approval": row.approval is not None,
        "awaiting_approval": row.approval == PENDING_APPROVAL,
        "error": row.error,
        "started_at": iso(row.started_at),
        "completed_at": iso(row.completed_at),
    }


def fits_carried(text: str | None) -> bool:
    """Whether a step's runnable form is small enough to travel in its message."""
    return text is not None and len(text) <= CARRY_MAX_CHARS


def carried_step(workflow_id: str, step_id: str, revision: int, raw: str) -> ClaimedStep | None:
    """The step a message carries (what a peek reads, as JSON), or None if it is not one.
    Every field is type-checked: the message is untrusted, and the step's commit lands
    only if the row still holds exactly this."""
    payload = carried_object(raw)
    if payload is None or not _carried_step_fits(payload):
        return None
    return ClaimedStep(
        workflow_id=workflow_id,
        step_id=step_id,
        revision=revision,
        action=payload["action"],
        inputs=payload["inputs"],
        dependencies=payload["dependencies"],
        retry_count=payload["retry_count"],
        max_retries=payload["max_retries"],
        dep_outputs=payload["dep_outputs"],
        dependents=payload["dependents"],
        generation=payload["generation"],
    )


def _carried_step_fits(payload: Document) -> bool:
    names = ("dependencies", "dependents")
    return (
        isinstance(payload.get("action"), str)
        and all(isinstance(payload.get(name), dict) for name in ("inputs", "dep_outputs"))
        and all(_strings(payload.get(name)) for name in names)
        and all(_count(payload.get(name)) for name in ("retry_count", "max_retries"))
        and _generation(payload.get("generation"))
    )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _generation(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
