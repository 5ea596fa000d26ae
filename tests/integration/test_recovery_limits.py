"""A turn that keeps losing its worker is given up after AGENTSTATE_MAX_RECOVERIES, however
busy the queue is, and whoever re-delivers it (the broker or the sweep)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

from config import Settings
from state.agent import Agent, PhaseContext, PhaseResult
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.errors import StateLockAcquisitionError
from state.machine import WORK_PHASES, Phase
from state.recovery.sweep import RecoverySweep
from state.storage.backend import Backend
from state.storage.tables import sessions, steps
from state.turns.draft import Delivery
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks import agent as reference
from tasks.actions import get_action, known_actions
from tests.integration.test_turn_engine import run_phase, send
from tests.support import uid


class BusyQueue(RecordingDispatcher):
    """Records dispatches, and reports a queue that never empties."""

    def backlog(self) -> int | None:
        return 50


class PlanningCounted:
    """The reference agent, counting the calls of its planning handler."""

    def __init__(self) -> None:
        self.calls = 0

    def planning(self, ctx: PhaseContext) -> PhaseResult:
        self.calls += 1
        return reference.planning(ctx)


def _engine(
    settings: Settings, dispatcher: RecordingDispatcher, counted: PlanningCounted
) -> TurnEngine:
    handlers = {phase: getattr(reference, phase) for phase in WORK_PHASES}
    handlers["planning"] = counted.planning
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    return TurnEngine(services, Agent(SimpleNamespace(**handlers), "counted"))


def _mid_turn(engine: TurnEngine, dispatcher: RecordingDispatcher) -> str:
    """A session whose turn is in planning, its planning task lost."""
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 4*4?")
    run_phase(engine, "understanding", session_id, None)
    dispatcher.sent.clear()
    return session_id


def test_the_sweep_counts_recoveries_while_the_queue_is_busy(settings: Settings) -> None:
    settings = settings.model_copy(update={"max_recoveries": 2})
    dispatcher, counted = BusyQueue(), PlanningCounted()
    engine = _engine(settings, dispatcher, counted)
    session_id = _mid_turn(engine, dispatcher)
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(engine.services.sessions.engine), dispatcher, get_action, settings
    )
    sweep = RecoverySweep(engine.services, engine.interventions, workflows)
    for _ in range(settings.max_recoveries + 1):
        with engine.services.sessions.engine.begin() as conn:  # stuck since long ago
            conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id)
                .values(updated_at=utcnow() - timedelta(hours=1))
            )
        sweep.run()
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    assert doc["metadata"]["last_error"]["detail"] == "gave up after 2 recoveries in phase planning"
    # Two resumes were sent (their tasks lost too), then it was given up.
    # (The sweep also meets other tests' sessions in a shared database: only ours count.)
    ours = [args for kind, args in dispatcher.sent if kind == "phase" and args[1] == session_id]
    assert ours == [("planning", session_id, ours[0][2])] * 2
    assert counted.calls == 0


def test_redeliveries_are_counted_even_while_the_lost_workers_lock_blocks_them(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"max_recoveries": 2})
    dispatcher, counted = RecordingDispatcher(), PlanningCounted()
    engine = _engine(settings, dispatcher, counted)
    # The lock wait of a phase is at most the lock's TTL: short for the blocked deliveries
    # only (the phases that commit keep the usual TTL: a busy machine may take longer
    # than a short one over a phase, and then the lock is rightly lost before its commit).
    hasty = _engine(settings.model_copy(update={"lock_timeout": 0.3}), dispatcher, counted)
    session_id = _mid_turn(engine, dispatcher)
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == Phase.PLANNING
    redelivered = Delivery(Phase.PLANNING, session_id, snap.revision, "t-1", False, True)
    with engine.services.sync.locked(session_id):  # the lost worker's lock, not yet expired
        for _ in range(settings.max_recoveries + 1):
            with pytest.raises(StateLockAcquisitionError):
                hasty.run_phase(redelivered)
    # The task's retry after the lock wait is not itself a redelivery, but the count is
    # in the row: it ends the turn instead of running the handler once more.
    retry = Delivery(Phase.PLANNING, session_id, snap.revision, "t-1", False, False)
    assert engine.run_phase(retry).status == "applied"
    assert counted.calls == 0
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    assert doc["metadata"]["last_error"]["detail"] == "gave up after 2 recoveries in phase planning"


def test_a_redelivery_below_the_limit_runs_the_phase(settings: Settings) -> None:
    dispatcher, counted = RecordingDispatcher(), PlanningCounted()
    engine = _engine(settings, dispatcher, counted)
    session_id = _mid_turn(engine, dispatcher)
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None
    redelivered = Delivery(Phase.PLANNING, session_id, snap.revision, "t-2", False, True)
    assert engine.run_phase(redelivered).phases == ["planning"]
    after = engine.services.sessions.load_from_database(session_id)
    assert after is not None and after.phase == Phase.RETRIEVING and after.recoveries == 0
    assert counted.calls == 1


def test_a_redelivered_quick_step_is_claimed_so_that_a_lost_worker_counts(
    settings: Settings,
) -> None:
    """A quick action's step commits once on its first delivery; a redelivery (its worker
    was lost) is claimed instead, so the lease and the sweep's count of lost workers
    apply; a failing quick run is claimed under its task id before it counts."""
    backend = Backend.build(settings)
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(backend.engine), RecordingDispatcher(), get_action, settings
    )
    spec = {
        "steps": [
            {"step_id": "first", "action": "echo"},
            {"step_id": "again", "action": "echo"},
            {"step_id": "bad", "action": "calculate", "inputs": {"expression": "1/0"}},
        ]
    }
    workflow_id = workflows.start(workflows.validate(spec, known_actions()))
    assert workflows.run_step(workflow_id, "first", 0, "t-1") == "success"
    assert workflows.run_step(workflow_id, "again", 0, "t-2", redelivered=True) == "success"
    assert workflows.run_step(workflow_id, "bad", 0, "t-3") == "failed"
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.step_id, steps.c.revision, steps.c.last_task_id).where(
                steps.c.workflow_id == workflow_id
            )
        )
        found = {row.step_id: (row.revision, row.last_task_id) for row in rows}
    # One commit (0 -> 1); claim + success (0 -> 2); claim + failure, under its task id.
    assert found == {"first": (1, "t-1"), "again": (2, "t-2"), "bad": (2, "t-3")}
