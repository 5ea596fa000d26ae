"""The seed's own usage of its classes: a workflow driven by setting step statuses
directly and asking again, as the design article's code does."""

from __future__ import annotations

from datetime import UTC, datetime

from state.machine import AgentStateMachine, Phase
from state.workflow import WorkflowState, WorkflowStep, WorkflowStepStatus


def _step(step_id: str, *deps: str) -> WorkflowStep:
    return WorkflowStep(
        step_id=step_id,
        step_name=step_id,
        status=WorkflowStepStatus.PENDING,
        dependencies=list(deps),
        inputs={},
        outputs={},
    )


def _diamond() -> WorkflowState:
    steps = [_step("a"), _step("b", "a"), _step("c", "a"), _step("d", "b", "c")]
    return WorkflowState("wf-seed", "s-seed", {s.step_id: s for s in steps})


def _ready(wf: WorkflowState) -> list[str]:
    return [s.step_id for s in wf.get_ready_steps()]


def test_statuses_set_directly_drive_get_ready_steps() -> None:
    wf = _diamond()
    assert _ready(wf) == ["a"]
    wf.steps["a"].status = WorkflowStepStatus.RUNNING
    assert _ready(wf) == []
    wf.steps["a"].status = WorkflowStepStatus.SUCCESS
    assert _ready(wf) == ["b", "c"]
    wf.steps["b"].status = WorkflowStepStatus.SUCCESS
    assert _ready(wf) == ["c"]
    wf.steps["c"].status = WorkflowStepStatus.SUCCESS
    assert _ready(wf) == ["d"]
    assert not wf.is_complete()
    wf.steps["d"].status = WorkflowStepStatus.SUCCESS
    assert _ready(wf) == []
    assert wf.is_complete()


def test_the_seeds_loop_runs_a_diamond_to_completion() -> None:
    # The article's executor: take the ready steps, run them, mark them, ask again.
    wf = _diamond()
    order: list[list[str]] = []
    for _round in range(len(wf.steps) + 1):  # bounded: a stuck workflow fails, not hangs
        if wf.is_complete():
            break
        ready = wf.get_ready_steps()
        assert ready, "a workflow that is not complete must have a ready step"
        order.append([s.step_id for s in ready])
        for step in ready:
            step.status = WorkflowStepStatus.RUNNING
            step.started_at = datetime.now(UTC)
            step.outputs = {"done": step.step_id}
            step.status = WorkflowStepStatus.SUCCESS
            step.completed_at = datetime.now(UTC)
    assert order == [["a"], ["b", "c"], ["d"]]


def test_a_skipped_dependency_counts_as_complete_but_does_not_release() -> None:
    wf = _diamond()
    wf.steps["a"].status = WorkflowStepStatus.SUCCESS
    wf.steps["b"].status = WorkflowStepStatus.SKIPPED
    wf.steps["c"].status = WorkflowStepStatus.SUCCESS
    assert _ready(wf) == []  # d needs b to have succeeded
    wf.steps["d"].status = WorkflowStepStatus.SKIPPED
    assert wf.is_complete()


def test_direct_status_changes_and_the_incremental_path_agree() -> None:
    direct, incremental = _diamond(), _diamond()
    direct.steps["a"].status = WorkflowStepStatus.SUCCESS
    released = incremental.mark_success("a", {})
    assert [s.step_id for s in released] == _ready(direct) == _ready(incremental)


def test_the_machine_restores_at_a_phase_given_as_enum_or_text() -> None:
    for initial in (Phase.EXECUTING, "executing"):
        machine = AgentStateMachine("s-1", initial)
        assert machine.state == "executing" and type(machine.state) is str
        assert machine.tools_complete() == "evaluating"
