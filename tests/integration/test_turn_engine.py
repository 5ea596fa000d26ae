"""The turn engine in-process (real Redis and database, a recording dispatcher)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from config import HopPolicy, Settings
from state.agent import PhaseContext, PhaseResult, load_agent
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.errors import LockLostError
from state.machine import Phase
from state.recovery.sweep import RecoverySweep
from state.sessions.snapshot import SessionChange
from state.storage import keys
from state.storage.backend import Backend
from state.storage.tables import inbox, sessions
from state.turns.draft import Delivery, PhaseOutcome
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions
from tests.support import make_settings, uid


def engine_for(
    settings: Settings, agent: str = "tasks.agent"
) -> tuple[TurnEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    return TurnEngine(services, load_agent(agent)), dispatcher


def run_phase(
    engine: TurnEngine,
    phase: str,
    session_id: str,
    revision: int | None,
    task_id: str | None = None,
) -> PhaseOutcome:
    return engine.run_phase(Delivery(Phase(phase), session_id, revision, task_id))


def drain(engine: TurnEngine, dispatcher: RecordingDispatcher) -> list[str]:
    """Run every dispatched phase until none is left; return the tasks' phases."""
    ran: list[str] = []
    while dispatcher.sent:
        kind, args = dispatcher.sent.pop(0)
        if kind == "phase":
            outcome = run_phase(engine, str(args[0]), str(args[1]), args[2])  # type: ignore[arg-type]
            ran.append(f"{args[0]}:{outcome.status}")
    return ran


def send(engine: TurnEngine, dispatcher: RecordingDispatcher, session_id: str, text: str) -> None:
    item = engine.services.inbox.accept(session_id, "u-1", text)
    if item.needs_kick:
        dispatcher.phase("understanding", session_id, item.session_revision)


def test_every_phase_policy_dispatches_each_phase(settings: Settings) -> None:
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    ran = drain(engine, dispatcher)
    assert ran == [
        f"{p}:applied"
        for p in (
            "understanding",
            "planning",
            "retrieving",
            "executing",
            "evaluating",
            "generating",
        )
    ]
    assert engine.services.sessions.history(session_id)[-1]["content"] == "6*7 = 42"


def test_inline_policy_hops_only_before_a_slow_phase(settings: Settings) -> None:
    engine, dispatcher = engine_for(settings.model_copy(update={"hop_policy": HopPolicy.INLINE}))
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    ran = drain(engine, dispatcher)
    assert ran == ["understanding:applied", "executing:applied"]  # two tasks, six commits
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.revision == 6
    assert snap.doc["metadata"]["turn"]["path"] == [
        "idle",
        "understanding",
        "planning",
        "retrieving",
        "executing",
        "evaluating",
        "generating",
        "idle",
    ]


def test_a_message_arriving_mid_turn_needs_no_kick_and_is_answered(settings: Settings) -> None:
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 1+1?")
    _kind, args = dispatcher.sent.pop(0)
    run_phase(engine, str(args[0]), session_id, args[2])  # understanding: now mid-turn
    item = engine.services.inbox.accept(session_id, "u-1", "what is 2+2?")
    assert not item.needs_kick
    drain(engine, dispatcher)
    contents = [m["content"] for m in engine.services.sessions.history(session_id)]
    assert contents == ["what is 1+1?", "1+1 = 2", "what is 2+2?", "2+2 = 4"]


@pytest.mark.parametrize("policy", [HopPolicy.EVERY_PHASE, HopPolicy.INLINE])
def test_a_burst_to_a_resting_session_kicks_once_and_each_message_is_answered(
    settings: Settings, policy: HopPolicy
) -> None:
    """Messages sent to a resting session before its turn starts: the first kicks, the
    turn it starts goes on to the others (a kick each would be a task each that finds the
    session busy); once all are answered, the next message kicks again."""
    engine, dispatcher = engine_for(settings.model_copy(update={"hop_policy": policy}))
    session_id = uid("s")
    for n in range(4):
        send(engine, dispatcher, session_id, f"what is {n}+{n}?")
    kicks = [args for kind, args in dispatcher.sent if args[0] == Phase.UNDERSTANDING]
    assert len(kicks) == 1
    drain(engine, dispatcher)
    history = engine.services.sessions.history(session_id)
    assert [m["content"] for m in history] == [
        text for n in range(4) for text in (f"what is {n}+{n}?", f"{n}+{n} = {2 * n}")
    ]
    later = engine.services.inbox.accept(session_id, "u-1", "what is 5+5?")
    assert later.needs_kick


def test_a_lost_kick_of_a_burst_is_sent_again_by_the_sweep(settings: Settings) -> None:
    """The one kick of a burst lost with the broker: the messages behind it sent none, and
    the recovery sweep starts the turn, which answers them all."""
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    items = [engine.services.inbox.accept(session_id, "u-1", f"what is {n}*3?") for n in (1, 2)]
    assert [item.needs_kick for item in items] == [True, False]  # the kick: lost
    long_ago = utcnow() - timedelta(hours=1)
    with engine.services.sessions.engine.begin() as conn:  # waiting, untouched, for an hour
        waiting = inbox.c.session_id == session_id
        conn.execute(update(inbox).where(waiting).values(created_at=long_ago))
        untouched = sessions.c.session_id == session_id
        conn.execute(update(sessions).where(untouched).values(updated_at=long_ago))
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(engine.services.sessions.engine), dispatcher, get_action, settings
    )
    RecoverySweep(engine.services, engine.interventions, workflows).run()
    # (The sweep also meets other tests' sessions in a shared database: only ours run.)
    dispatcher.sent[:] = [(kind, args) for kind, args in dispatcher.sent if args[1] == session_id]
    assert dispatcher.sent == [("phase", (Phase.UNDERSTANDING, session_id, None))]
    drain(engine, dispatcher)
    contents = [m["content"] for m in engine.services.sessions.history(session_id)]
    assert contents == ["what is 1*3?", "1*3 = 3", "what is 2*3?", "2*3 = 6"]


@pytest.mark.parametrize("policy", [HopPolicy.EVERY_PHASE, HopPolicy.INLINE])
def test_a_stale_cached_copy_is_caught_and_the_database_used(
    settings: Settings, policy: HopPolicy
) -> None:
    """(Inline, on Postgres: the commits staged from the cached copy are refused together,
    and the retry from the database starts over without them.)"""
    engine, dispatcher = engine_for(settings.model_copy(update={"hop_policy": policy}))
    session_id = uid("s")
    item = engine.services.inbox.accept(session_id, "u-1", "what is 3+3?")
    snap = engine.services.sessions.load_from_database(session_id)  # caches revision 0
    assert snap is not None
    # Another writer commits revision 1 and dies before refreshing the cache.
    engine.services.sessions.commit(
        snap, SessionChange(phase="idle", status="active", doc=dict(snap.doc))
    )
    outcome = run_phase(engine, "understanding", session_id, item.session_revision)
    assert outcome.status == "applied"
    ran = ["understanding", "planning", "retrieving"] if policy == HopPolicy.INLINE else None
    assert outcome.phases == (ran or ["understanding"])
    drain(engine, dispatcher)
    assert engine.services.sessions.history(session_id)[-1]["content"] == "3+3 = 6"


def test_a_holder_that_lost_its_lock_is_refused_and_does_not_run_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker paused or partitioned away while another took the session's lock: its
    # commit is refused, and (working from the cache) it must not retry the phase from
    # the database, which would run the handler a second time without the lock.
    engine, dispatcher = engine_for(settings.model_copy(update={"lock_timeout": 0.2}))
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    _kind, (_phase, _sid, revision) = dispatcher.sent.pop(0)
    run_phase(engine, "understanding", session_id, revision)  # type: ignore[arg-type]
    _kind, (phase, _sid, revision) = dispatcher.sent.pop(0)
    assert phase == "planning"  # at a revision the cache holds
    ran: list[str] = []
    handler = engine.agent.run

    def overtaken(phase: str, ctx: PhaseContext) -> PhaseResult:
        ran.append(phase)
        engine.services.cache.redis.set(keys.session_lock(session_id), "another-worker")
        time.sleep(0.15)  # past half the TTL: the commit asks Redis
        return handler(phase, ctx)

    monkeypatch.setattr(engine.agent, "run", overtaken)
    with pytest.raises(LockLostError):
        run_phase(engine, "planning", session_id, revision)  # type: ignore[arg-type]
    assert ran == ["planning"]
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and (snap.phase, snap.revision) == ("planning", revision)


def test_a_redelivered_task_whose_commit_landed_resends_its_follow_up(settings: Settings) -> None:
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 4+4?")
    dispatcher.sent.clear()
    run_phase(engine, "understanding", session_id, None, task_id="task-1")
    assert dispatcher.sent == [("phase", ("planning", session_id, 1))]
    dispatcher.sent.clear()  # the broker lost the follow-up
    outcome = run_phase(engine, "understanding", session_id, None, task_id="task-1")
    assert outcome.status == "duplicate"
    assert dispatcher.sent == [("phase", ("planning", session_id, 1))]
    other = run_phase(engine, "understanding", session_id, None, task_id="task-2")
    assert other.status == "duplicate"
    assert dispatcher.sent == [("phase", ("planning", session_id, 1))]  # nothing more


def test_resume_and_break_turn_from_any_phase(settings: Settings) -> None:
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 5+5?")
    dispatcher.sent.clear()
    run_phase(engine, "understanding", session_id, None)
    dispatcher.sent.clear()
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == "planning"
    assert engine.interventions.resume(snap) == "planning"
    assert dispatcher.sent == [("phase", ("planning", session_id, snap.revision))]
    outcome = engine.interventions.break_turn(snap, "error_occurred", "sorry", "poison")
    assert outcome.status == "error_occurred"
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["metadata"]["last_error"]["detail"] == "poison"
    assert doc["message_history"][-1]["content"] == "sorry"


def test_a_poison_message_is_rejected_with_an_apology(settings: Settings) -> None:
    engine, _dispatcher = engine_for(settings)
    session_id = uid("s")
    engine.services.inbox.accept(session_id, "u-1", "boom")
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None
    engine.interventions.reject_next_message(snap, "gave up after 3 attempts")
    history = engine.services.sessions.history(session_id)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert engine.services.inbox.queued_count(session_id) == 0


def test_the_deadline_is_checked_when_executing_commits(pg_url: str) -> None:
    settings = make_settings(pg_url, execution_timeout=0.2)
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 7+7?")
    while dispatcher.sent:
        kind, args = dispatcher.sent.pop(0)
        if kind == "timeout":
            continue  # the countdown task is lost: the commit-time check must catch it
        if args[0] == "executing":
            time.sleep(0.3)  # the handler overran its deadline
        run_phase(engine, str(args[0]), session_id, args[2])  # type: ignore[arg-type]
    doc = engine.services.sessions.document(session_id)
    assert doc is not None
    assert doc["metadata"]["last_error"]["cause"] == "timeout"
    assert doc["phase"] == "idle"


@pytest.mark.parametrize("phase", ["error", "timeout"])
def test_a_session_left_in_error_or_timeout_is_reset_by_resume(
    settings: Settings, phase: str
) -> None:
    engine, _dispatcher = engine_for(settings)
    session_id = uid("s")
    snap = engine.services.sessions.create(session_id, "u-1")
    with engine.services.sessions.engine.begin() as conn:
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(phase=phase, revision=5)
        )
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None
    assert engine.interventions.resume(snap) == "reset"
    after = engine.services.sessions.load_from_database(session_id)
    assert after is not None and after.phase == "idle"


def test_resting_reads_phase_and_queue_together(settings: Settings) -> None:
    # wait_for_idle relies on this: a turn that starts between two separate reads would
    # look like an idle session with nothing queued.
    engine, dispatcher = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 9+9?")
    assert engine.services.inbox.resting(session_id) == ("idle", 1)
    _kind, args = dispatcher.sent.pop(0)
    run_phase(engine, str(args[0]), session_id, args[2])
    assert engine.services.inbox.resting(session_id) == ("planning", 0)
    drain(engine, dispatcher)
    assert engine.services.inbox.resting(session_id) == ("idle", 0)
    assert engine.services.inbox.resting(uid("nobody")) is None


def test_a_result_that_cannot_be_stored_ends_the_turn_with_an_apology(
    settings: Settings,
) -> None:
    engine, dispatcher = engine_for(settings, "tests.agents")
    session_id = uid("s")
    send(engine, dispatcher, session_id, "unstorable please")
    drain(engine, dispatcher)
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    error = doc["metadata"]["last_error"]
    assert "divided by zero" in error["detail"] and error["phase"] == "executing"
    assert engine.services.users.load_user_state("u-1").get("memories") is None


def test_a_bug_in_the_engine_is_not_turned_into_an_apology(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, dispatcher = engine_for(settings, "tests.agents")
    session_id = uid("s")
    send(engine, dispatcher, session_id, "remember that bugs surface")

    def broken_mutate(*_args: object, **_kwargs: object) -> None:
        raise KeyError("a bug in the engine's own code")

    monkeypatch.setattr("state.storage.user_rows.mutate", broken_mutate)
    with pytest.raises(KeyError):
        drain(engine, dispatcher)
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == "executing"  # nothing committed: retried later
    history = engine.services.sessions.history(session_id)
    assert all(m["metadata"].get("kind") != "apology" for m in history)
