"""Commits of consecutive quick phases held back and sent together (the inline policy on
Postgres): the same rows as one commit after another, one query message instead of
several, all or nothing when one of them lost the race."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from psycopg2.extras import LoggingConnection
from sqlalchemy import create_engine, event, select

from config import HopPolicy, Settings
from config.settings import DbPooler
from state.agent import Agent, PhaseContext, PhaseResult, quick
from state.dispatch import RecordingDispatcher
from state.documents.codec import loads
from state.errors import StaleStateError
from state.machine import WORK_PHASES, Phase
from state.session import SessionStatus
from state.sessions.inbox import Inbox
from state.sessions.snapshot import CommitResult, SessionChange, Snapshot, Staged
from state.sessions.store import SessionStore
from state.sessions.store_postgres import PostgresSessionStore
from state.storage.backend import Backend
from state.storage.tables import revisions, sessions
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from tasks import agent as reference
from tasks.actions import known_actions
from tests.integration.test_store_write_paths import _rows, _turn
from tests.integration.test_turn_engine import drain, run_phase, send
from tests.support import uid

POOLERS = [DbPooler.NONE, DbPooler.PGBOUNCER]
HUNG_S = 4.0  # a hung handler, past a 0.3 s phase time limit


def _store(settings: Settings, pooler: DbPooler) -> tuple[Backend, PostgresSessionStore]:
    backend = Backend.build(settings.model_copy(update={"db_pooler": pooler}))
    store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
    assert isinstance(store, PostgresSessionStore)
    return backend, store


class StagingStore(PostgresSessionStore):
    """Holds back every commit it can and sends it with the next (what the engine does
    for quick phases)."""

    def __init__(self, inner: PostgresSessionStore) -> None:
        super().__init__(inner.engine, inner.cache, inner.statements)
        self.held: list[Staged] = []

    def commit(self, snapshot: Snapshot, change: SessionChange, *args: Any, **kw: Any) -> Any:
        staged = self.stage(snapshot, change)
        if staged is not None:
            self.held.append(staged)
            return CommitResult(staged.snapshot, queued=False)
        held, self.held = self.held, []
        return super().commit(snapshot, change, None, held)


@pytest.mark.parametrize("pooler", POOLERS)
def test_staged_commits_leave_the_rows_one_commit_after_another_leaves(
    pg_settings: Settings, pooler: DbPooler
) -> None:
    backend, store = _store(pg_settings, pooler)
    staging = StagingStore(store)
    inbox_ = Inbox(backend.engine)
    one_by_one, together = uid("s"), uid("s")
    _turn(store, inbox_, one_by_one)
    _turn(staging, inbox_, together)
    assert staging.held == []  # the turn's last commit took the two before it along
    left, right = _rows(backend, one_by_one), _rows(backend, together)
    assert [r["revision"] for r in right["revisions"]] == [0, 1, 2, 3]
    assert left == right


@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize("sent_by", ["flush", "commit"])
def test_a_staged_commit_that_lost_the_race_undoes_everything_sent_with_it(
    pg_settings: Settings, pooler: DbPooler, sent_by: str
) -> None:
    """Another writer moved the row from revision r to r+1 first. The first staged commit
    (r -> r+1) finds it moved; the second (r+1 -> r+2) would match the other writer's row
    by revision alone: it must not apply either, nor anything sent after it."""
    backend, store = _store(pg_settings, pooler)
    session_id = uid("s")
    snap = store.create(session_id, "erin")
    snap = store.commit(snap, _change(snap, Phase.UNDERSTANDING, "mine")).snapshot
    first = store.stage(snap, _change(snap, Phase.PLANNING, "staged-1"))
    assert first is not None
    second = store.stage(first.snapshot, _change(first.snapshot, Phase.RETRIEVING, "staged-2"))
    assert second is not None
    store.commit(snap, _change(snap, Phase.PLANNING, "theirs"))  # the other writer
    with pytest.raises(StaleStateError):
        if sent_by == "flush":
            store.flush([first, second], None)
        else:
            last = _change(second.snapshot, Phase.EXECUTING, "last")
            store.commit(second.snapshot, last, None, [first, second])
    with backend.engine.connect() as conn:
        row = conn.execute(select(sessions).where(sessions.c.session_id == session_id)).one()
        records = conn.execute(
            select(revisions.c.revision)
            .where(revisions.c.session_id == session_id)
            .order_by(revisions.c.revision)
        ).all()
    assert row.revision == 2 and loads(row.doc)["context_window"] == {"by": "theirs"}
    assert [r.revision for r in records] == [0, 1, 2]


def _change(snap: Snapshot, phase: Phase, by: str) -> SessionChange:
    doc = {**snap.doc, "context_window": {"by": by}}
    return SessionChange(phase=phase, status=SessionStatus.ACTIVE, doc=doc)


def _count_commit_messages(backend: Backend, store: SessionStore) -> list[str]:
    """The query messages that carry a session commit, as the driver sends them.

    The hot path sends through a driver cursor (``state.storage.dbapi``), past
    SQLAlchemy's execution events, so the store's autocommit engine is swapped for one
    whose connections are psycopg2's ``LoggingConnection``: it writes each query it sends
    to the recorder below.
    """
    sent: list[str] = []

    class Recorder:
        def write(self, text: str) -> None:
            statement = text.strip()
            if statement.startswith("PREPARE"):
                return  # once per connection, before its first EXECUTE
            if "agentstate_commit" in statement or "UPDATE sessions SET revision" in statement:
                sent.append(statement)

    assert isinstance(store, PostgresSessionStore)
    url = store.autocommit.url.render_as_string(hide_password=False)
    logged = create_engine(
        url, isolation_level="AUTOCOMMIT", connect_args={"connection_factory": LoggingConnection}
    )
    event.listen(logged, "connect", lambda conn, _: conn.initialize(Recorder()), insert=True)
    store.autocommit = logged
    return sent


@pytest.mark.parametrize("pooler", POOLERS)
def test_an_inline_turn_sends_each_run_of_quick_phases_in_one_query_message(
    pg_settings: Settings, pooler: DbPooler
) -> None:
    settings = pg_settings.model_copy(update={"hop_policy": HopPolicy.INLINE, "db_pooler": pooler})
    dispatcher = RecordingDispatcher()
    backend = Backend.build(settings)
    services = TurnServices.build(backend, dispatcher, known_actions)
    engine = TurnEngine(services, Agent(reference, "reference"))
    sent = _count_commit_messages(backend, services.sessions)
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    assert drain(engine, dispatcher) == ["understanding:applied", "executing:applied"]
    # understanding + planning + retrieving; executing (may have side effects: alone);
    # evaluating + generating (the turn's end, with its inbox check).
    assert [_statements_in(message) for message in sent] == [3, 1, 2]
    assert services.sessions.history(session_id)[-1]["content"] == "6*7 = 42"
    with backend.engine.connect() as conn:
        phases = conn.execute(
            select(revisions.c.phase)
            .where(revisions.c.session_id == session_id)
            .order_by(revisions.c.revision)
        ).all()
    # One record a commit, each with the phase it left the session in.
    assert [p.phase for p in phases] == ["idle", *WORK_PHASES[1:], "idle"]


def _statements_in(message: str) -> int:
    return message.count("agentstate_commit") or message.count("UPDATE sessions SET revision")


class HistoryReading:
    """The reference agent whose quick planning reads the history (the message that
    understanding's commit, held back, added)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def planning(self, ctx: PhaseContext) -> PhaseResult:
        self.seen.append([item["content"] for item in ctx.recent_messages(5)])
        return reference.planning(ctx)


def test_a_quick_handler_reading_the_history_sees_the_commits_held_back(
    pg_settings: Settings,
) -> None:
    settings = pg_settings.model_copy(update={"hop_policy": HopPolicy.INLINE})
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    reading = HistoryReading()
    handlers: dict[str, Any] = {phase: getattr(reference, phase) for phase in WORK_PHASES}

    @quick
    def planning(ctx: PhaseContext) -> PhaseResult:
        return reading.planning(ctx)

    handlers["planning"] = planning
    engine = TurnEngine(services, Agent(SimpleNamespace(**handlers), "reading"))
    session_id = uid("s")
    send(engine, dispatcher, session_id, "what is 6*7?")
    drain(engine, dispatcher)
    assert reading.seen == [["what is 6*7?"]]


@pytest.mark.parametrize("fails", [True, False])
def test_a_commit_with_ops_takes_the_staged_ones_into_its_transaction(
    pg_settings: Settings, fails: bool
) -> None:
    """A change with extra work goes the portable way; the commits held back before it
    run in its transaction, so they land with it or, when it fails, not at all."""
    _backend, store = _store(pg_settings, DbPooler.NONE)
    session_id = uid("s")
    snap = store.create(session_id, "fay")
    staged = store.stage(snap, _change(snap, Phase.PLANNING, "staged"))
    assert staged is not None
    with_ops = _change(staged.snapshot, Phase.RETRIEVING, "with ops")
    with_ops.ops.append(_failing if fails else _nothing)
    if fails:
        with pytest.raises(RuntimeError):
            store.commit(staged.snapshot, with_ops, None, [staged])
    else:
        store.commit(staged.snapshot, with_ops, None, [staged])
    row = store.load_from_database(session_id)
    assert row is not None
    assert row.revision == (0 if fails else 2)
    assert row.doc.get("context_window") == ({} if fails else {"by": "with ops"})


def _failing(conn: Any) -> None:
    raise RuntimeError("an op failed")


def _nothing(conn: Any) -> None:
    pass


def _inline_engine(settings: Settings, **handlers: Any) -> TurnEngine:
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    chosen = {phase: getattr(reference, phase) for phase in WORK_PHASES} | handlers
    return TurnEngine(services, Agent(SimpleNamespace(**chosen), "staging"))


def test_the_watchdog_ends_a_hung_quick_phase_after_staged_ones(pg_settings: Settings) -> None:
    """understanding's commit is held back when planning (quick) hangs: the watchdog's
    timeout commit takes it along and ends the turn at the limit, not when the handler
    returns; the handler's late commit then changes nothing."""
    settings = pg_settings.model_copy(
        update={"hop_policy": HopPolicy.INLINE, "phase_time_limit": 0.3}
    )

    @quick
    def planning(ctx: PhaseContext) -> PhaseResult:
        time.sleep(HUNG_S)
        return reference.planning(ctx)

    engine = _inline_engine(settings, planning=planning)
    session_id = uid("s")
    item = engine.services.inbox.accept(session_id, "u-1", "what is 2+2?")
    runner = threading.Thread(
        target=lambda: _ignore_stale(
            lambda: run_phase(engine, "understanding", session_id, item.session_revision)
        )
    )
    started = time.monotonic()
    runner.start()
    # The watchdog looks once a second at most: the apology lands within the limit plus
    # that, well before the handler returns.
    history: list[Any] = []
    while len(history) < 2 and time.monotonic() - started < HUNG_S - 1:
        time.sleep(0.05)
        history = engine.services.sessions.history(session_id)
    runner.join(10)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[-1]["metadata"]["kind"] == "apology"
    later = engine.services.sessions.load_from_database(session_id)
    assert later is not None and later.phase == "idle"
    assert len(engine.services.sessions.history(session_id)) == 2  # nothing more landed


def _ignore_stale(run: Any) -> None:
    with contextlib.suppress(StaleStateError):
        run()
