"""A turn that keeps losing its worker is given up after AGENTSTATE_MAX_RECOVERIES, however
busy the queue is, and whoever re-delivers it (the broker or the sweep)."""

from __future__ import annotations

import time
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


def _age(engine: TurnEngine, session_id: str, *, backoff_over: bool) -> None:
    """The session looks stuck since long ago (and its re-send back-off ran out)."""
    values: dict[str, object] = {"updated_at": utcnow() - timedelta(hours=1)}
    if backoff_over:
        values["resend_at"] = time.time() - 1
    with engine.services.sessions.engine.begin() as conn:
        conn.execute(update(sessions).where(sessions.c.session_id == session_id).values(**values))


def test_queued_work_is_never_given_up_and_its_resends_back_off(settings: Settings) -> None:
    """A turn whose phase merely waits in a busy queue: the sweep sends it again, never
    counts that as a recovery (nothing shows a worker took it), and backs off."""
    settings = settings.model_copy(update={"max_recoveries": 2})
    dispatcher, counted = BusyQueue(), PlanningCounted()
    engine = _engine(settings, dispatcher, counted)
    session_id = _mid_turn(engine, dispatcher)
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(engine.services.sessions.engine), dispatcher, get_action, settings
    )
    sweep = RecoverySweep(engine.services, engine.interventions, workflows)

    def ours() -> list[tuple[object, ...]]:
        return [a for kind, a in dispatcher.sent if kind == "phase" and a[1] == session_id]

    for _ in range(settings.max_recoveries + 3):
        _age(engine, session_id, backoff_over=True)
        sweep.run()
        _age(engine, session_id, backoff_over=False)  # stuck still, but backing off
        sweep.run()
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "planning"  # waits on: never given up
    assert len(ours()) == settings.max_recoveries + 3  # one re-send per back-off
    with engine.services.sessions.engine.connect() as conn:
        row = conn.execute(
            select(sessions.c.recoveries, sessions.c.resends, sessions.c.resend_at).where(
                sessions.c.session_id == session_id
            )
        ).one()
    assert row.recoveries == 0
    assert row.resends == settings.max_recoveries + 3
    # The next re-send waits STUCK_AFTER x 16 at most (the back-off's ceiling).
    assert row.resend_at - time.time() > settings.stuck_after * 15
    assert counted.calls == 0


def test_a_lost_steps_worker_counts_once_per_claim(settings: Settings) -> None:
    """A running step whose lease ran out counts one recovery and is sent again; while
    that re-send merely waits (no claim since: same revision) it counts no more."""
    backend = Backend.build(settings)
    dispatcher = RecordingDispatcher()
    store = WorkflowStore.for_engine(backend.engine)
    workflows = WorkflowEngine(store, dispatcher, get_action, settings)
    spec = {"steps": [{"step_id": "slow", "action": "sleep", "inputs": {"seconds": 0}}]}
    workflow_id = workflows.start(workflows.validate(spec, known_actions()))
    claimed = store.claim(workflow_id, "slow", 0, 60.0, "t-1")
    assert claimed is not None
    engine = _engine(settings, dispatcher, PlanningCounted())
    sweep = RecoverySweep(engine.services, engine.interventions, workflows)

    def lose_lease(**extra: object) -> None:
        with backend.engine.begin() as conn:
            conn.execute(
                update(steps)
                .where(steps.c.workflow_id == workflow_id)
                .values(lease_expires_at=time.time() - 1, **extra)
            )

    def recoveries() -> int:
        with backend.engine.connect() as conn:
            query = select(steps.c.recoveries).where(steps.c.workflow_id == workflow_id)
            return int(conn.execute(query).scalar_one())

    lose_lease()
    sweep.run()
    assert recoveries() == 1
    for _ in range(3):  # its re-send waits in the queue: not taken, not counted
        lose_lease(resend_at=time.time() - 1)
        sweep.run()
    assert recoveries() == 1
    sent = [a for kind, a in dispatcher.sent if kind == "step" and a[0] == workflow_id]
    assert len(sent) == 1 + 1 + 3  # the start, then each re-send


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
