"""The Postgres session store's one-statement write and the portable write leave the
same rows behind (events and revision records included), for every shape of commit a
turn makes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, update

from config import Settings
from config.settings import DbPooler
from state.documents.codec import loads
from state.errors import SessionOwnershipError, StaleStateError
from state.machine import Phase
from state.session import SessionStatus, make_message
from state.sessions.inbox import Inbox
from state.sessions.inbox_postgres import PostgresInbox
from state.sessions.snapshot import InboxState, NewEvent, SessionChange, Snapshot
from state.sessions.store import SessionStore
from state.sessions.store_postgres import PostgresSessionStore
from state.storage.backend import Backend
from state.storage.prepared import UNPREPARED
from state.storage.tables import events, inbox, messages, revisions, sessions
from tests.support import uid

_VOLATILE = {"session_id", "updated_at", "created_at", "message_id", "timestamp", "id", "at"}
_VOLATILE.add("generation")  # minted per row: two rows never share one
_JSON_COLUMNS = ("doc", "data", "patch")


def _turn(store: SessionStore, inbox_: Inbox, session_id: str) -> None:
    """A whole turn's commits: a middle phase, one with history rows and inbox changes,
    and one that ends the turn and checks the inbox."""
    item = inbox_.accept(session_id, "alice", "what is 2+2?")
    snap = store.load_from_database(session_id)
    assert snap is not None
    steps: list[dict[str, Any]] = [
        {
            "phase": Phase.UNDERSTANDING,
            "new_messages": [make_message("user", item.text, {"message_id": "m"})],
            "inbox_state": {item.message_id: InboxState.STARTED},
        },
        {"phase": Phase.PLANNING, "deadline_at": 123.5, "task_id": "task-2"},
        {
            "phase": Phase.IDLE,
            "new_messages": [make_message("assistant", "4", {"reply_to": "m"})],
            "inbox_state": {item.message_id: InboxState.ANSWERED},
            "check_inbox": True,
        },
    ]
    for fields in steps:
        doc = {**snap.doc, "context_window": {"step": str(fields["phase"])}}
        events = [NewEvent("step", {"phase": str(fields["phase"])})]
        change = SessionChange(
            status=SessionStatus.ACTIVE, doc=doc, events=events, trigger="t", **fields
        )
        snap = store.commit(snap, change).snapshot


def _rows(backend: Backend, session_id: str) -> dict[str, Any]:
    def plain(row: Any) -> dict[str, Any]:
        data = {k: v for k, v in row._mapping.items() if k not in _VOLATILE}
        for column in _JSON_COLUMNS:
            if data.get(column) is not None:
                data[column] = _stripped(_loads(data[column]))
        return data

    with backend.engine.connect() as conn:
        return {
            table.name: [
                plain(r)
                for r in conn.execute(
                    select(table)
                    .where(table.c.session_id == session_id)
                    .order_by(*table.primary_key)
                )
            ]
            for table in (sessions, messages, inbox, events, revisions)
        }


def _stripped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stripped(v) for k, v in value.items() if k not in _VOLATILE}
    return value


def _loads(raw: str) -> dict[str, Any]:
    value = loads(raw)
    assert isinstance(value, dict)
    return value


def test_both_write_paths_leave_the_same_rows(pg_settings: Settings) -> None:
    backend = Backend.build(pg_settings)
    portable = SessionStore(backend.engine, backend.cache)
    fast = SessionStore.for_engine(backend.engine, backend.cache)
    assert type(fast) is PostgresSessionStore
    inbox_ = Inbox(backend.engine)
    first, second = uid("s"), uid("s")
    _turn(portable, inbox_, first)
    _turn(fast, inbox_, second)
    left, right = _rows(backend, first), _rows(backend, second)
    assert left["sessions"][0]["revision"] == 3
    assert len(left["messages"]) == 2
    # message_accepted, then each commit's own event and its closing phase_committed.
    assert [e["kind"] for e in left["events"]] == [
        "message_accepted",
        *["step", "phase_committed"] * 3,
    ]
    assert [e["seq"] for e in left["events"]] == list(range(1, 8))
    assert left["sessions"][0]["event_seq"] == 7
    assert [r["revision"] for r in left["revisions"]] == [0, 1, 2, 3]
    assert left["revisions"][0]["doc"] is not None  # revision 0: the whole document
    assert all(r["patch"] is not None for r in left["revisions"][1:])  # then the changes
    assert left == right


def test_the_fast_path_refuses_a_stale_revision_like_the_portable_one(
    pg_settings: Settings,
) -> None:
    backend = Backend.build(pg_settings)
    for store in (
        SessionStore(backend.engine, backend.cache),
        SessionStore.for_engine(backend.engine, backend.cache),
    ):
        session_id = uid("s")
        snap: Snapshot = store.create(session_id, "bob")
        change = SessionChange(
            phase=Phase.PLANNING, status=SessionStatus.ACTIVE, doc=dict(snap.doc)
        )
        store.commit(snap, change)
        with pytest.raises(StaleStateError):
            store.commit(snap, change)


def test_the_unprepared_statements_leave_the_same_rows(pg_settings: Settings) -> None:
    """Behind PgBouncer (AGENTSTATE_DB_POOLER=pgbouncer) the one-statement commit goes
    unprepared; it must write exactly what the prepared one writes."""
    backend = Backend.build(pg_settings.model_copy(update={"db_pooler": DbPooler.PGBOUNCER}))
    assert backend.statements is UNPREPARED
    prepared_store = SessionStore.for_engine(backend.engine, backend.cache)
    unprepared = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
    assert isinstance(unprepared, PostgresSessionStore) and unprepared.statements is UNPREPARED
    inbox_ = Inbox(backend.engine)
    first, second = uid("s"), uid("s")
    _turn(prepared_store, inbox_, first)
    _turn(unprepared, inbox_, second)
    assert _rows(backend, first) == _rows(backend, second)


def _ending(snap: Snapshot) -> SessionChange:
    return SessionChange(
        phase=Phase.IDLE, status=SessionStatus.ACTIVE, doc=dict(snap.doc), check_inbox=True
    )


@pytest.mark.parametrize("pooler", [DbPooler.NONE, DbPooler.PGBOUNCER])
def test_a_turn_end_sees_a_message_committed_while_it_waited_for_the_row(
    pg_settings: Settings, pooler: DbPooler
) -> None:
    """The check for queued messages runs after the update took the row lock, with a
    snapshot of its own: a message whose accepting transaction held the row while the
    turn's last commit waited for it is seen (the turn takes it, no kick needed)."""
    backend = Backend.build(pg_settings.model_copy(update={"db_pooler": pooler}))
    store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
    session_id = uid("s")
    snap = store.create(session_id, "carol")
    snap = store.commit(
        snap, SessionChange(phase=Phase.GENERATING, status=SessionStatus.ACTIVE, doc=dict(snap.doc))
    ).snapshot
    holding, results = threading.Event(), []
    with backend.engine.begin() as conn:
        item = Inbox(backend.engine)._accept(conn, session_id, "carol", "late", None)
        assert not item.needs_kick  # mid-turn: its sender leaves it to the running turn
        ender = threading.Thread(
            target=lambda: (holding.set(), results.append(store.commit(snap, _ending(snap))))
        )
        ender.start()
        holding.wait(5)
        time.sleep(0.3)  # the commit is now waiting for the row this transaction holds
        assert results == []
    ender.join(10)
    assert len(results) == 1 and results[0].queued


@pytest.mark.parametrize("portable", [False, True], ids=["one-statement", "portable"])
@pytest.mark.parametrize("pooler", [DbPooler.NONE, DbPooler.PGBOUNCER])
def test_an_accept_behind_a_turn_that_ran_while_it_waited_for_the_row_still_kicks(
    pg_settings: Settings, pooler: DbPooler, portable: bool
) -> None:
    """A message accepted behind a waiting one needs no kick, unless that message's whole
    turn ran while this accept waited for the session row: then it is the only message
    waiting in a resting session, and without its kick it would wait for the sweep. (Read
    in the accept's own snapshot, taken before the wait, the earlier message would still
    look queued.)"""
    backend = Backend.build(pg_settings.model_copy(update={"db_pooler": pooler}))
    fast = Inbox.for_engine(backend.engine, backend.statements)
    inbox_ = Inbox(backend.engine) if portable else fast
    session_id = uid("s")
    first = inbox_.accept(session_id, "frank", "first")
    assert first.needs_kick
    results: list[Any] = []
    with backend.engine.begin() as conn:  # a turn that takes the first message from start to end
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(revision=sessions.c.revision + 2)
        )
        conn.execute(
            update(inbox)
            .where(inbox.c.message_id == first.message_id)
            .values(state=InboxState.ANSWERED)
        )
        accepting = threading.Thread(
            target=lambda: results.append(inbox_.accept(session_id, "frank", "second"))
        )
        accepting.start()
        time.sleep(0.3)  # the accept now waits for the row this transaction holds
        assert results == []
    accepting.join(10)
    assert len(results) == 1 and results[0].needs_kick and results[0].session_revision == 2
    third = inbox_.accept(session_id, "frank", "third")
    assert not third.needs_kick  # the second is waiting, and its kick is on its way


@pytest.mark.parametrize("pooler", [DbPooler.NONE, DbPooler.PGBOUNCER])
def test_a_stale_turn_end_writes_nothing_and_reports_nothing_queued(
    pg_settings: Settings, pooler: DbPooler
) -> None:
    backend = Backend.build(pg_settings.model_copy(update={"db_pooler": pooler}))
    store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
    session_id = uid("s")
    snap = store.create(session_id, "dave")
    Inbox(backend.engine).accept(session_id, "dave", "waiting")
    moved = store.commit(
        snap, SessionChange(phase=Phase.GENERATING, status=SessionStatus.ACTIVE, doc=dict(snap.doc))
    )
    assert not moved.queued  # a middle commit does not look
    before = _rows(backend, session_id)
    with pytest.raises(StaleStateError):
        store.commit(snap, _ending(snap))  # the row is no longer at snap's revision
    assert _rows(backend, session_id) == before
    done = store.commit(moved.snapshot, _ending(moved.snapshot))
    assert done.queued  # the waiting message is seen by the commit that applies


@pytest.mark.parametrize("pooler", [DbPooler.NONE, DbPooler.PGBOUNCER])
def test_both_accept_paths_leave_the_same_rows(pg_settings: Settings, pooler: DbPooler) -> None:
    """The one-statement accept (an existing session, no key) writes what the portable
    accept writes: the message, its event, the counters; and says when to kick."""
    backend = Backend.build(pg_settings.model_copy(update={"db_pooler": pooler}))
    portable, fast = Inbox(backend.engine), Inbox.for_engine(backend.engine, backend.statements)
    assert isinstance(fast, PostgresInbox) and fast.statements is backend.statements
    store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
    first, second = uid("s"), uid("s")
    for inbox_, session_id in ((portable, first), (fast, second)):
        items = [inbox_.accept(session_id, "erin", f"message {n}") for n in range(3)]
        # Resting: the first kicks; the others wait behind it, for the turn it starts.
        assert [item.needs_kick for item in items] == [True, False, False]
        snap = store.load_from_database(session_id)
        assert snap is not None
        change = SessionChange(phase=Phase.PLANNING, status=SessionStatus.ACTIVE, doc=snap.doc)
        store.commit(snap, change)
        late = inbox_.accept(session_id, "erin", "mid-turn")
        assert not late.needs_kick and late.session_revision == 1 and late.seq == 4
        queued = inbox_.next_queued(session_id)
        assert queued is not None and (queued.seq, queued.text) == (1, "message 0")
        with pytest.raises(SessionOwnershipError):
            inbox_.accept(session_id, "mallory", "let me in")
    left, right = _rows(backend, first), _rows(backend, second)
    assert [e["kind"] for e in left["events"]].count("message_accepted") == 4
    for rows in (left, right):  # in message id order: random ids
        rows["inbox"].sort(key=lambda row: row["seq"])
    assert left == right
