"""How a turn ends badly: the phase a failure is recorded in, and the deadline of a turn
that waits on its workflow (in-process engine, real Redis and database)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from config import Settings
from state.agent import Agent, PhaseContext, PhaseResult
from state.dispatch import RecordingDispatcher
from state.machine import Phase
from state.storage.backend import Backend
from state.turns.draft import Delivery
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from tasks import agent as reference
from tasks.actions import known_actions
from tests.support import make_settings, uid


def engine_with(settings: Settings, agent: Agent) -> tuple[TurnEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    return TurnEngine(services, agent), dispatcher


def run_phases(engine: TurnEngine, dispatcher: RecordingDispatcher) -> None:
    """Run every dispatched phase (and nothing else) until none is left."""
    for kind, args in list(dispatcher.sent):
        if kind == "phase":
            dispatcher.sent.remove((kind, args))
            phase, session_id, revision = args
            engine.run_phase(Delivery(Phase(str(phase)), str(session_id), revision))  # type: ignore[arg-type]
            run_phases(engine, dispatcher)
            return


def start(engine: TurnEngine, dispatcher: RecordingDispatcher, text: str) -> str:
    session_id = uid("s")
    item = engine.services.inbox.accept(session_id, "u-1", text)
    dispatcher.phase("understanding", session_id, item.session_revision)
    run_phases(engine, dispatcher)
    return session_id


def test_a_failure_in_the_first_phase_is_recorded_in_that_phase(settings: Settings) -> None:
    def understanding(ctx: PhaseContext) -> PhaseResult:
        raise RuntimeError("cannot understand")

    agent = Agent(SimpleNamespace(understanding=understanding), "fails-first")
    engine, dispatcher = engine_with(settings, agent)
    session_id = start(engine, dispatcher, "hello")
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    error = doc["metadata"]["last_error"]
    assert error["phase"] == "understanding", error  # the snapshot's phase was still idle
    assert "cannot understand" in error["detail"]


def test_a_failure_in_a_later_phase_is_recorded_in_that_phase(settings: Settings) -> None:
    def evaluating(ctx: PhaseContext) -> PhaseResult:
        raise RuntimeError("cannot judge")

    source = SimpleNamespace(**{p: getattr(reference, p) for p in ("understanding", "planning")})
    source.evaluating = evaluating
    engine, dispatcher = engine_with(settings, Agent(source, "fails-later"))
    session_id = start(engine, dispatcher, "what is 1+1?")
    doc = engine.services.sessions.document(session_id)
    assert doc is not None
    assert doc["metadata"]["last_error"]["phase"] == "evaluating"


def test_waiting_on_a_workflow_leaves_no_countdown_message_behind(pg_url: str) -> None:
    # A countdown task would sit in the broker until the deadline even when the workflow
    # finishes first; the deadline is rung in-process instead, and only when it is due.
    settings = make_settings(pg_url, execution_timeout=0.5, stuck_after=0.5, sweep_interval=0.25)
    engine, dispatcher = engine_with(settings, Agent(reference, "tasks.agent"))
    session_id = start(engine, dispatcher, "what is 2+3 and 4*5?")
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == "executing"
    assert engine.services.waiting_on_workflow(snap)
    assert [kind for kind, _ in dispatcher.sent if kind == "timeout"] == []
    # Nobody runs the workflow's steps: the deadline passes and the check is sent, due now.
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up and not any(k == "timeout" for k, _ in dispatcher.sent):
        time.sleep(0.05)
    timeouts = [args for kind, args in dispatcher.sent if kind == "timeout"]
    assert timeouts == [(session_id, snap.deadline_at, 0.0)]
    deadline = float(snap.deadline_at or 0.0)
    # Waiting on a running workflow, the turn gets the time the sweep needs to recover a
    # lost step (STUCK_AFTER + two sweeps) and a fresh EXECUTION_TIMEOUT before it is
    # timed out.
    assert engine.interventions.fire_timeout(session_id, deadline).status == "not-due"
    time.sleep(max(0.0, deadline + 0.5 + 2 * 0.25 + 0.5 - time.time()) + 0.05)
    outcome = engine.interventions.fire_timeout(session_id, deadline)
    assert outcome.status == "timeout"
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["metadata"]["last_error"]["cause"] == "timeout"
