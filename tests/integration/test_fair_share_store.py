"""Fair share in the store, in-process (real database): a step that waits for its
approval is not sent until decided, and a user's ready steps beyond
AGENTSTATE_USER_STEP_CONCURRENCY wait in the database until that user's steps finish."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from config import Settings
from state.approvals.desk import ApprovalDesk
from state.approvals.rows import Decision
from state.backlog import steps_waiting
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.recovery.queries import stuck_steps
from state.storage.backend import Backend
from state.storage.tables import steps
from state.workflows.creation import insert_workflow
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions
from tests.support import uid


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


def _owned(workflows: WorkflowEngine, owner: str, n: int) -> str:
    """A workflow of ``owner`` with ``n`` independent steps that claim before running."""
    spec = {
        "steps": [
            {"step_id": f"s{i}", "action": "sleep", "inputs": {"seconds": 0}} for i in range(n)
        ]
    }
    wf = workflows.validate(spec, known_actions())
    with workflows.store.engine.begin() as conn:
        insert_workflow(conn, wf, approval_ttl_s=60.0, user_id=owner)
    return wf.workflow_id


def _waiting(workflows: WorkflowEngine, workflow_id: str) -> list[str]:
    with workflows.store.engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.step_id)
            .where(steps.c.workflow_id == workflow_id, steps.c.waiting_since.is_not(None))
            .order_by(steps.c.step_id)
        )
        return [r[0] for r in rows]


def test_a_users_steps_beyond_the_cap_wait_in_the_database_until_theirs_finish(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"user_step_concurrency": 2})
    workflows, dispatcher = _engine(settings)
    alice, bob = uid("alice"), uid("bob")
    mine = _owned(workflows, alice, 4)
    # Two of alice's steps run (claimed, their workers busy): her share is full.
    running = [workflows.store.claim(mine, f"s{i}", 0, 60.0, f"t{i}") for i in range(2)]
    assert all(running)
    assert workflows.run_step(mine, "s2", 0, "t2") == "waiting"
    assert workflows.run_step(mine, "s3", 0, "t3") == "waiting"
    assert _waiting(workflows, mine) == ["s2", "s3"]
    assert steps_waiting(workflows.store.engine) >= 2
    # Parked steps are not "forgotten": the sweep neither counts nor re-sends them.
    forgotten = stuck_steps(workflows.store.engine, utcnow() + timedelta(hours=1), 10_000)
    assert not [row for row in forgotten if row[0] == mine and row[3] == "pending"]
    # Bob's share is his own: alice's full share does not hold his steps back.
    his = _owned(workflows, bob, 1)
    assert workflows.run_step(his, "s0", 0, "b0") == "success"
    # One of alice's finishes: her oldest waiting step is released (sent), one only.
    dispatcher.sent.clear()
    first = running[0]
    assert first is not None
    workflows.follow(workflows.store.succeed(first, {}))
    released = workflows.share.release(mine)
    assert [(wf, sid) for wf, sid, _ in released] == [(mine, "s2")]
    assert _sent_steps(dispatcher, mine) == ["s2"]
    assert _waiting(workflows, mine) == ["s3"]
    # The released step runs; as it finishes, the last one is released in turn.
    assert workflows.run_step(mine, "s2", released[0][2], "t2b") == "success"
    assert _waiting(workflows, mine) == []
    assert _sent_steps(dispatcher, mine) == ["s2", "s3"]


def test_the_sweep_releases_users_in_turn(settings: Settings) -> None:
    settings = settings.model_copy(update={"user_step_concurrency": 1})
    workflows, _ = _engine(settings)
    owners = [uid("u1"), uid("u2")]
    flows = [_owned(workflows, owner, 3) for owner in owners]
    for wf in flows:
        assert workflows.store.claim(wf, "s0", 0, 60.0, "t") is not None
        for sid in ("s1", "s2"):
            assert workflows.run_step(wf, sid, 0, f"t-{sid}") == "waiting"
    with workflows.store.engine.begin() as conn:  # their running steps are gone
        conn.execute(
            update(steps)
            .where(steps.c.workflow_id.in_(flows))
            .where(steps.c.step_id == "s0")
            .values(status="success")
        )
    released = [r for r in workflows.share.release_all() if r[0] in flows]
    # One step of each owner (the cap), the owner waiting longest first.
    assert [(wf, sid) for wf, sid, _ in released] == [(flows[0], "s1"), (flows[1], "s1")]
