"""Fair share in the store, in-process (real database): a step that waits for its
approval is not sent until decided, and a user's ready steps beyond
AGENTSTATE_USER_STEP_CONCURRENCY wait in the database until that user's steps finish."""

from __future__ import annotations

from typing import Any

from config import Settings
from state.approvals.desk import ApprovalDesk
from state.approvals.rows import Decision
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.recovery.queries import stuck_steps
from state.storage.backend import Backend
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions


def _engine(settings: Settings) -> tuple[WorkflowEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    backend = Backend.build(settings)
    store = WorkflowStore.for_engine(backend.engine)
    return WorkflowEngine(store, dispatcher, get_action, settings), dispatcher


def _sent_steps(dispatcher: RecordingDispatcher, workflow_id: str) -> list[str]:
    return [
        str(args[1]) for kind, args in dispatcher.sent if kind == "step" and args[0] == workflow_id
    ]


def test_a_step_waiting_for_approval_is_sent_when_decided(settings: Settings) -> None:
    workflows, dispatcher = _engine(settings)
    spec: dict[str, Any] = {
        "steps": [
            {"step_id": "ask", "action": "echo", "approval": True},
            {"step_id": "first", "action": "echo"},
            {"step_id": "then", "action": "echo", "dependencies": ["first"], "approval": True},
        ]
    }
    workflow_id = workflows.start(workflows.validate(spec, known_actions()))
    assert _sent_steps(dispatcher, workflow_id) == ["first"]
    assert workflows.run_step(workflow_id, "first", 0, "t-1") == "success"
    # "then" is ready but waits for its approval: nothing sent, and the sweep leaves it.
    assert _sent_steps(dispatcher, workflow_id) == ["first"]
    forgotten = stuck_steps(workflows.store.engine, utcnow(), 10_000)
    assert not [row for row in forgotten if row[0] == workflow_id]
    desk = ApprovalDesk(workflows.store.engine, None, workflows)  # type: ignore[arg-type]
    pending = {a["step_id"]: a for a in desk.list(pending=True) if a["workflow_id"] == workflow_id}
    desk.decide(pending["then"]["approval_id"], Decision(approve=True, by="alice"))
    assert _sent_steps(dispatcher, workflow_id) == ["first", "then"]
