"""Quick phases run from the snapshot their message carries: no lock, no cache read, and
a commit that lands only if the row holds exactly that snapshot (real Redis/Postgres)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from config import Settings
from state.agent import load_agent
from state.dispatch import RecordingDispatcher
from state.documents import codec
from state.documents.codec import Document
from state.errors import StaleStateError
from state.lock import DistributedStateSync, LockHandle
from state.machine import Phase
from state.sessions.snapshot import CARRY_MAX_CHARS, SessionChange, Snapshot, carried_snapshot
from state.storage.backend import Backend
from state.storage.cache import CachedEntry
from state.turns.draft import Delivery
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from tasks.actions import known_actions
from tests.support import uid

QUICK = ["understanding", "planning", "retrieving", "evaluating", "generating"]
TURN = ["understanding", "planning", "retrieving", "executing", "evaluating", "generating"]


class CountingSync(DistributedStateSync):
    """The real lock, counting the phases that take it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acquired: list[str] = []

    def acquire(self, session_id: str, **kwargs: Any) -> tuple[LockHandle, CachedEntry | None]:
        self.acquired.append(session_id)
        return super().acquire(session_id, **kwargs)


def engine_for(settings: Settings) -> tuple[TurnEngine, RecordingDispatcher, CountingSync]:
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    sync = CountingSync(services.sync.redis, services.sessions, settings=settings)
    services = TurnServices(**{**services.__dict__, "sync": sync})
    return TurnEngine(services, load_agent("tasks.agent")), dispatcher, sync


def send(engine: TurnEngine, dispatcher: RecordingDispatcher, session_id: str, text: str) -> None:
    item = engine.services.inbox.accept(session_id, "u-1", text)
    if item.needs_kick:
        dispatcher.phase("understanding", session_id, item.session_revision)


def next_delivery(dispatcher: RecordingDispatcher) -> Delivery:
    """The next dispatched phase as its task would deliver it (carried snapshot included)."""
    _kind, args = dispatcher.sent.pop(0)
    phase, session_id, revision = str(args[0]), str(args[1]), args[2]
    assert revision is None or isinstance(revision, int)
    carried = dispatcher.carried.get((phase, session_id, revision))
    return Delivery(Phase(phase), session_id, revision, uid("task"), carried=carried)


def drain(engine: TurnEngine, dispatcher: RecordingDispatcher) -> list[str]:
    ran: list[str] = []
    while dispatcher.sent:
        delivery = next_delivery(dispatcher)
        outcome = engine.run_phase(delivery)
        ran.append(f"{delivery.phase}:{outcome.status}")
    return ran


def applied(phases: list[str]) -> list[str]:
    return [f"{phase}:applied" for phase in phases]


def test_quick_phases_take_no_lock_and_read_no_cache(pg_settings: Settings) -> None:
    engine, dispatcher, sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    assert drain(engine, dispatcher) == applied(TURN)
    # The kick carries nothing, and executing may be slow: only they took the lock.
    assert len(sync.acquired) == 2
    carried = {phase for phase, sid, _rev in dispatcher.carried if sid == session_id}
    assert carried == {"planning", "retrieving", "evaluating", "generating"}
    assert engine.services.sessions.history(session_id)[-1]["content"] == "6*7 = 42"
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.revision == 6
    # The carried commits cached their snapshots like locked ones do.
    cached = engine.services.sessions.load(session_id, expected_revision=6)
    assert cached is not None and cached.doc == snap.doc


def test_carrying_off_locks_every_phase(pg_settings: Settings) -> None:
    settings = pg_settings.model_copy(update={"carry_snapshot": False})
    engine, dispatcher, sync = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    assert drain(engine, dispatcher) == applied(TURN)
    assert len(sync.acquired) == 6
    assert dispatcher.carried == {}
    assert engine.services.sessions.history(session_id)[-1]["content"] == "6*7 = 42"


def test_a_store_that_cannot_check_a_carried_snapshot_gets_none(settings: Settings) -> None:
    engine, dispatcher, sync = engine_for(settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    assert drain(engine, dispatcher) == applied(TURN)
    if engine.services.sessions.verifies_carried:
        assert len(sync.acquired) == 2
    else:  # SQLite: nothing carried, every phase locked
        assert (dispatcher.carried, len(sync.acquired)) == ({}, 6)


def _doctored(raw: str, doctor: Callable[[Document], None]) -> str:
    payload = codec.loads(raw)
    doctor(payload)
    return codec.dumps(payload)


def _ask(payload: Document, text: str) -> None:
    payload["doc"]["context_window"]["message"] = text


def test_a_forged_snapshot_at_the_right_revision_commits_nothing(pg_settings: Settings) -> None:
    engine, dispatcher, _sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    assert engine.run_phase(next_delivery(dispatcher)).status == "applied"  # understanding
    legit = next_delivery(dispatcher)
    assert legit.phase == Phase.PLANNING and legit.carried is not None
    forged = Delivery(
        Phase.PLANNING,
        session_id,
        legit.revision,
        uid("forged"),
        carried=_doctored(legit.carried, lambda p: _ask(p, "what is 2+2?")),
    )
    outcome = engine.run_phase(forged)
    # Its commit was refused; the phase ran once more, locked, from the database.
    assert (outcome.status, outcome.phases) == ("applied", ["planning"])
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.revision == 2
    assert snap.doc["context_window"]["message"] == "what is 6*7?"
    assert engine.run_phase(legit).status == "duplicate"
    assert drain(engine, dispatcher) == applied(TURN[2:])
    contents = [m["content"] for m in engine.services.sessions.history(session_id)]
    assert contents == ["what is 6*7?", "6*7 = 42"]


def test_a_carried_snapshot_behind_the_row_is_dropped_as_a_duplicate(
    pg_settings: Settings,
) -> None:
    engine, dispatcher, _sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 1+1?")
    engine.run_phase(next_delivery(dispatcher))
    planning = next_delivery(dispatcher)
    assert engine.run_phase(planning).status == "applied"
    again = engine.run_phase(planning)  # the broker delivers it twice
    assert (again.status, again.phases) == ("duplicate", [])
    # Same task id as the commit's: its follow-up is sent again, and dropped in turn.
    ran = drain(engine, dispatcher)
    assert ran == ["retrieving:applied", "retrieving:duplicate", *applied(TURN[3:])]
    contents = [m["content"] for m in engine.services.sessions.history(session_id)]
    assert contents == ["what is 1+1?", "1+1 = 2"]


def _set(key: str, value: object) -> Callable[[Document], None]:
    return lambda payload: payload.__setitem__(key, value)


DOCTORINGS: dict[str, Callable[[Document], None]] = {
    "the document": lambda p: _ask(p, "what is 2+2?"),
    "a key added to the document": lambda p: p["doc"].__setitem__("extra", 1),
    "an integer as a float": lambda p: p["doc"].__setitem__("_version", 1.0 * p["doc"]["_version"]),
    "the message count": lambda p: p.__setitem__("message_count", p["message_count"] + 1),
    "the user": _set("user_id", "u-someone-else"),
    "the last task": _set("last_task_id", "task-forged"),
    "a deadline": _set("deadline_at", 1.0),
    "the status": _set("status", "paused"),
}


@pytest.mark.parametrize("portable", [False, True], ids=["one-statement", "portable"])
@pytest.mark.parametrize("what", list(DOCTORINGS))
def test_a_commit_binds_the_carried_snapshot_to_the_row(
    pg_settings: Settings, what: str, portable: bool
) -> None:
    engine, dispatcher, _sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    engine.run_phase(next_delivery(dispatcher))
    carried = next_delivery(dispatcher).carried
    assert carried is not None
    sessions = engine.services.sessions

    def commit(raw: str) -> Snapshot:
        snap = carried_snapshot(session_id, 1, raw)
        assert snap is not None and snap.carried
        ops = [lambda conn: None] if portable else []  # ops take the portable path
        change = SessionChange(phase="planning", status="active", doc=dict(snap.doc), ops=ops)
        return sessions.commit(snap, change).snapshot

    with pytest.raises(StaleStateError):
        commit(_doctored(carried, DOCTORINGS[what]))
    assert commit(carried).revision == 2  # the true snapshot commits


def test_a_carried_snapshot_that_is_not_one_is_ignored() -> None:
    good = {
        "user_id": "u-1",
        "phase": "planning",
        "status": "active",
        "doc": {},
        "message_count": 1,
        "last_task_id": None,
        "deadline_at": None,
    }
    assert carried_snapshot("s-1", 1, codec.dumps(good)) is not None
    bad: list[object] = [
        "not json",
        [],
        {**good, "doc": []},
        {**good, "message_count": True},
        {**good, "message_count": -1},
        {**good, "message_count": 2**40},
        {**good, "deadline_at": "soon"},
        {**good, "deadline_at": False},
        {**good, "last_task_id": 7},
        {key: value for key, value in good.items() if key != "user_id"},
        {**good, "doc": {"x": "y" * CARRY_MAX_CHARS}},
    ]
    for value in bad:
        raw = value if isinstance(value, str) else codec.dumps(value)
        assert carried_snapshot("s-1", 1, raw) is None, value


def test_a_snapshot_spelled_other_than_its_writer_spells_it_is_ignored() -> None:
    """The commit compares documents as jsonb, which reads 1e2 as 100 and -0.0 as 0.0:
    the handler would get a float, or a negative zero, for what the row holds."""
    good = codec.dumps(
        {
            "user_id": "u-1",
            "phase": "planning",
            "status": "active",
            "doc": {"n": 100, "x": 0.0},
            "message_count": 1,
            "last_task_id": None,
            "deadline_at": None,
        }
    )
    assert carried_snapshot("s-1", 1, good) is not None
    for respelled in (
        good.replace('"n":100', '"n":1e2'),
        good.replace('"x":0.0', '"x":-0.0'),
        good.replace('"n":100', '"n":100 '),
        good.replace('"n":100', '"n":100,"n":100'),
        good.replace('"u-1"', '"\\u0075-1"'),
    ):
        assert respelled != good and codec.loads(respelled)["user_id"] == "u-1"
        assert carried_snapshot("s-1", 1, respelled) is None, respelled


def test_a_forged_snapshot_with_nothing_to_do_is_never_cached(pg_settings: Settings) -> None:
    engine, dispatcher, _sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    drain(engine, dispatcher)
    sessions = engine.services.sessions
    snap = sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == "idle"
    forged = codec.dumps({**snap.to_cache(), "doc": {**snap.doc, "forged": True}})
    delivery = Delivery(Phase.UNDERSTANDING, session_id, snap.revision, uid("f"), carried=forged)
    assert engine.run_phase(delivery).status == "nothing-to-do"  # no message waits
    cached = sessions.load(session_id, expected_revision=snap.revision)
    assert cached is not None and "forged" not in cached.doc


def test_a_retried_delivery_ignores_what_it_carries(pg_settings: Settings) -> None:
    engine, dispatcher, sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    engine.run_phase(next_delivery(dispatcher))
    planning = next_delivery(dispatcher)
    assert planning.carried is not None
    before = len(sync.acquired)
    retried = Delivery(
        planning.phase,
        session_id,
        planning.revision,
        planning.task_id,
        use_cache=False,
        carried=planning.carried,
    )
    assert engine.run_phase(retried).status == "applied"
    assert len(sync.acquired) == before + 1  # its own commit may have landed: it asks the row


def test_a_message_that_waited_starts_its_turn_from_the_carried_snapshot(
    pg_settings: Settings,
) -> None:
    engine, dispatcher, sync = engine_for(pg_settings)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 1+1?")
    engine.run_phase(next_delivery(dispatcher))  # understanding: now mid-turn
    assert not engine.services.inbox.accept(session_id, "u-1", "what is 2+2?").needs_kick
    ran = drain(engine, dispatcher)
    assert ran == applied(TURN[1:] + TURN)  # the first turn's end dispatched the second
    assert ("understanding", session_id, 6) in dispatcher.carried
    assert len(sync.acquired) == 3  # the kick, and each turn's executing
    contents = [m["content"] for m in engine.services.sessions.history(session_id)]
    assert contents == ["what is 1+1?", "1+1 = 2", "what is 2+2?", "2+2 = 4"]
