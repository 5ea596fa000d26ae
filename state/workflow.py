"""Layer 2, workflow state: multi-step work as a DAG of steps.

The seed's queries (:meth:`WorkflowState.get_ready_steps`, :meth:`WorkflowState.is_complete`)
answer from the steps' statuses as they are now, including a status set directly on a
step, as the seed's own code drives them. The engine's path is incremental instead: each
step keeps a count of unfinished dependencies, so :meth:`WorkflowState.mark_success`
returns the dependents it made ready in O(its dependents), not a scan over every step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

DEFAULT_MAX_RETRIES = 3


class WorkflowStepStatus(StrEnum):
    """Where one step is."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"
    RETRYING = "retrying"


class WorkflowStatus(StrEnum):
    """Where a whole workflow is: running until every step is terminal."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @classmethod
    def finished(cls) -> frozenset[WorkflowStatus]:
        """The statuses of a workflow that nothing changes but a retry."""
        return frozenset({cls.SUCCESS, cls.FAILED, cls.CANCELLED})


TERMINAL = frozenset(
    {WorkflowStepStatus.SUCCESS, WorkflowStepStatus.FAILED, WorkflowStepStatus.SKIPPED}
)


@dataclass
class WorkflowStep:
    """One unit of work and what it needs first."""

    step_id: str
    step_name: str
    status: WorkflowStepStatus
    dependencies: list[str]
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    retry_count: int = 0
    max_retries: int = DEFAULT_MAX_RETRIES
    started_at: datetime | None = None
    completed_at: datetime | None = None
    action: str = "echo"
    timeout_s: float | None = None
    not_before_s: float | None = None
    approval: bool = False  # waits for a person's decision before it runs
    dependents: list[str] = field(default_factory=list)
    remaining_deps: int = 0

    @property
    def is_terminal(self) -> bool:
        """Success, failed or skipped: nothing more will happen to it."""
        return self.status in TERMINAL


@dataclass
class WorkflowState:
    """The progress of one workflow (see the module docstring for how readiness works)."""

    workflow_id: str
    session_id: str | None
    steps: dict[str, WorkflowStep]
    current_step: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    spec_hash: str | None = None  # the spec's fingerprint, when it came from one

    def __post_init__(self) -> None:
        self._link()

    def _link(self) -> None:
        """Derive dependents and unfinished-dependency counts from ``steps``."""
        for step in self.steps.values():
            step.dependents = []
        for step in self.steps.values():
            for dep in step.dependencies:
                self.steps[dep].dependents.append(step.step_id)
        for step in self.steps.values():
            step.remaining_deps = sum(
                1
                for dep in step.dependencies
                if self.steps[dep].status != WorkflowStepStatus.SUCCESS
            )

    def get_ready_steps(self) -> list[WorkflowStep]:
        """Pending steps whose dependencies all succeeded now, in definition order."""
        return [
            step
            for step in self.steps.values()
            if step.status == WorkflowStepStatus.PENDING
            and all(
                self.steps[dep].status == WorkflowStepStatus.SUCCESS for dep in step.dependencies
            )
        ]

    def start(self, step_id: str) -> WorkflowStep:
        """Mark a ready step running."""
        step = self.steps[step_id]
        step.status = WorkflowStepStatus.RUNNING
        self.current_step = step_id
        return step

    def mark_success(
        self, step_id: str, outputs: dict[str, Any] | None = None
    ) -> list[WorkflowStep]:
        """Record a success; return the dependents that just became ready."""
        step = self.steps[step_id]
        if step.is_terminal:
            return []  # a repeated completion must not release dependents twice
        step.status = WorkflowStepStatus.SUCCESS
        step.outputs = dict(outputs or {})
        newly_ready = []
        for dep_id in step.dependents:
            dependent = self.steps[dep_id]
            dependent.remaining_deps -= 1
            if dependent.remaining_deps == 0 and dependent.status == WorkflowStepStatus.PENDING:
                newly_ready.append(dependent)
        return newly_ready

    def mark_failed(self, step_id: str) -> list[WorkflowStep]:
        """Record a final failure; skip and return every transitive dependent."""
        if self.steps[step_id].is_terminal:
            return []
        self.steps[step_id].status = WorkflowStepStatus.FAILED
        skipped = []
        for dep_id in transitive_dependents(self.steps, [step_id]):
            dependent = self.steps[dep_id]
            if not dependent.is_terminal:
                dependent.status = WorkflowStepStatus.SKIPPED
                skipped.append(dependent)
        return skipped

    def is_complete(self) -> bool:
        """The seed's test: every step succeeded or was skipped."""
        return all(
            s.status in (WorkflowStepStatus.SUCCESS, WorkflowStepStatus.SKIPPED)
            for s in self.steps.values()
        )

    def is_finished(self) -> bool:
        """Every step is terminal (success, failed or skipped)."""
        return all(s.is_terminal for s in self.steps.values())

    @property
    def status(self) -> WorkflowStatus:
        """``running`` until finished, then ``failed`` if any step failed, else ``success``."""
        if not self.is_finished():
            return WorkflowStatus.RUNNING
        failed = any(s.status == WorkflowStepStatus.FAILED for s in self.steps.values())
        return WorkflowStatus.FAILED if failed else WorkflowStatus.SUCCESS


def transitive_dependents(steps: dict[str, WorkflowStep], roots: Iterable[str]) -> list[str]:
    """Every step downstream of ``roots`` (breadth first, each once, roots excluded)."""
    seen: set[str] = set(roots)
    order: list[str] = []
    queue = deque(seen)
    while queue:
        for dep_id in steps[queue.popleft()].dependents:
            if dep_id not in seen:
                seen.add(dep_id)
                order.append(dep_id)
                queue.append(dep_id)
    return order
