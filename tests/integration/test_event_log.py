"""The event log and the revision records, on Postgres and SQLite, through every store
implementation: numbering, the workflow's own writes, time travel, forks and retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from config import Settings
from state.clock import utcnow
from state.errors import NotFoundError, SessionExistsError
from state.events import log
from state.events.feed import EventFeed
from state.events.fork import fork_session
from state.events.retention import prune
from state.events.revisions import CHECKPOINT_EVERY, at_revision
from state.machine import Phase
from state.session import SessionStatus, make_message
from state.sessions.inbox import Inbox
from state.sessions.snapshot import NewEvent, SessionChange, Snapshot
from state.sessions.store import SessionStore
from state.storage.backend import Backend
from state.storage.tables import events, revisions, sessions
from state.workflows.spec import parse_spec
from state.workflows.store import WorkflowStore
from tests.support import uid

IMPLEMENTATIONS = ["portable", "for_engine"]


@pytest.fixture
def backend(settings: Settings) -> Backend:
    return Backend.build(settings)


@pytest.fixture(params=IMPLEMENTATIONS)
def store(backend: Backend, request: pytest.FixtureRequest) -> SessionStore:
    if request.param == "portable":
        return SessionStore(backend.engine, backend.cache)
    return SessionStore.for_engine(backend.engine, backend.cache)


@pytest.fixture(params=IMPLEMENTATIONS)
def wfs(backend: Backend, request: pytest.FixtureRequest) -> WorkflowStore:
    if request.param == "portable":
        return WorkflowStore(backend.engine)
    return WorkflowStore.for_engine(backend.engine)


def _commits(store: SessionStore, session_id: str, count: int) -> list[dict[str, Any]]:
    """``count`` commits changing the document (and the history every third one); the
    session's full document after each, as get_session would have shown it."""
    snap = store.load_from_database(session_id)
    assert snap is not None
    seen = []
    for n in range(count):
        doc = {**snap.doc, "context_window": {"n": n, "even": n % 2 == 0}}
        doc["metadata"] = {**doc.get("metadata", {}), "step": n}
        if n % 5 == 4:
            doc.pop("tool_results", None)
        else:
            doc["tool_results"] = [n]
        news = [make_message("user", f"m{n}")] if n % 3 == 0 else []
        change = SessionChange(
            phase=Phase.PLANNING if n % 2 else Phase.IDLE,
            status=SessionStatus.ACTIVE,
            doc=doc,
            new_messages=news,
            events=[NewEvent("step", {"n": n})],
            trigger=f"t{n}",
        )
        snap = store.commit(snap, change).snapshot
        seen.append(store.document(session_id))
    return seen


def _events(backend: Backend, session_id: str) -> list[dict[str, Any]]:
    with backend.engine.connect() as conn:
        return log.read(conn, session_id, 0, 10_000)


def test_each_commit_numbers_its_events_without_gaps(backend: Backend, store: SessionStore) -> None:
    session_id = uid("s")
    Inbox(backend.engine).accept(session_id, "alice", "hello")
    _commits(store, session_id, 5)
    found = _events(backend, session_id)
    assert [e["seq"] for e in found] == list(range(1, 12))
    assert found[0]["kind"] == "message_accepted" and found[0]["revision"] == 0
    assert found[0]["data"]["text"] == "hello"
    assert [e["kind"] for e in found[1:3]] == ["step", "phase_committed"]
    assert found[2]["data"] == {"from": "idle", "trigger": "t0"}
    assert [e["revision"] for e in found[1:]] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert [e["phase"] for e in found[1:3]] == ["idle", "idle"]


def test_every_revision_reads_back_as_it_was(backend: Backend, store: SessionStore) -> None:
    session_id = uid("s")
    Inbox(backend.engine).accept(session_id, "alice", "hello")
    first = store.document(session_id)
    seen = [first, *_commits(store, session_id, CHECKPOINT_EVERY * 2 + 3)]
    feed = EventFeed(backend.engine, backend.redis)
    for doc in seen:
        assert doc is not None
        past = feed.session_at(store, session_id, doc["revision"])
        past.pop("queued")
        assert past == doc, doc["revision"]
    with backend.engine.connect() as conn:
        kept = conn.execute(
            select(func.count()).where(
                revisions.c.session_id == session_id, revisions.c.doc.is_not(None)
            )
        ).scalar_one()
    # Whole documents only at revision 0 and every CHECKPOINT_EVERY revisions.
    assert kept == 3
    with pytest.raises(NotFoundError, match="no revision"):
        feed.session_at(store, session_id, len(seen) + 5)


def test_a_finishing_workflow_tells_its_session(backend: Backend, wfs: WorkflowStore) -> None:
    session_id, workflow_id = uid("s"), uid("wf")
    Inbox(backend.engine).accept(session_id, "alice", "hello")
    spec = {"workflow_id": workflow_id, "steps": [{"step_id": "a", "action": "echo"}]}
    wfs.create(parse_spec({**spec, "session_id": session_id}))
    claimed = wfs.claim(workflow_id, "a", 0, lease_s=30)
    assert claimed is not None
    assert wfs.succeed(claimed, {"ok": True}).finished is not None
    found = _events(backend, session_id)
    assert [e["kind"] for e in found] == ["message_accepted", "workflow_finished"]
    assert found[1]["data"] == {"workflow_id": workflow_id, "status": "success"}
    assert found[1]["seq"] == 2 and found[1]["revision"] == 0
    # A workflow of no session tells nobody.
    other = uid("wf")
    wfs.create(parse_spec({"workflow_id": other, "steps": [{"step_id": "a", "action": "echo"}]}))
    claimed = wfs.claim(other, "a", 0, lease_s=30)
    assert claimed is not None
    wfs.fail(claimed, "no")
    assert len(_events(backend, session_id)) == 2


def test_a_cancelled_workflow_tells_its_session(backend: Backend, wfs: WorkflowStore) -> None:
    session_id, workflow_id = uid("s"), uid("wf")
    Inbox(backend.engine).accept(session_id, "alice", "hello")
    spec = {"workflow_id": workflow_id, "session_id": session_id, "steps": [{"step_id": "a"}]}
    spec["steps"][0]["action"] = "echo"
    wfs.create(parse_spec(spec))
    assert wfs.cancel_workflow(workflow_id) is not None
    assert _events(backend, session_id)[-1]["data"] == {
        "workflow_id": workflow_id,
        "status": "cancelled",
    }


def test_a_fork_has_the_state_and_history_of_its_revision(
    backend: Backend, store: SessionStore
) -> None:
    source, fork = uid("s"), uid("s")
    Inbox(backend.engine).accept(source, "alice", "hello")
    seen = _commits(store, source, 7)
    at = seen[3]
    assert fork_session(backend.engine, source, at["revision"], fork) == fork
    doc = store.document(fork)
    assert doc is not None
    assert doc["message_history"] == at["message_history"]
    assert doc["user_id"] == "alice" and doc["phase"] == "idle" and doc["revision"] == 0
    assert doc["context_window"] == at["context_window"]
    assert _events(backend, fork)[0]["kind"] == "forked"
    assert _events(backend, fork)[0]["data"] == {
        "source_session_id": source,
        "source_revision": at["revision"],
    }
    assert store.document(source) == seen[-1]
    # The fork goes on by itself.
    snap = store.load_from_database(fork)
    assert snap is not None
    store.commit(snap, SessionChange(phase=Phase.PLANNING, status="active", doc=dict(snap.doc)))
    assert [e["seq"] for e in _events(backend, fork)] == [1, 2]
    with pytest.raises(SessionExistsError):
        fork_session(backend.engine, source, 1, fork)
    with pytest.raises(NotFoundError):
        fork_session(backend.engine, source, 1, uid("s"), user_id="mallory")
    with pytest.raises(NotFoundError):
        fork_session(backend.engine, source, 999, uid("s"))


def test_pruning_keeps_the_current_state_and_every_kept_revision_readable(
    backend: Backend, store: SessionStore
) -> None:
    session_id = uid("s")
    Inbox(backend.engine).accept(session_id, "alice", "hello")
    seen = _commits(store, session_id, CHECKPOINT_EVERY * 2 + 5)
    old = utcnow() - timedelta(days=40)
    with backend.engine.begin() as conn:
        for table in (events, revisions):
            conn.execute(update(table).where(table.c.session_id == session_id).values(at=old))
    current = store.document(session_id)
    cutoff = utcnow() - timedelta(days=30)
    done = prune(backend.engine, cutoff, batch=7)
    assert done.events >= len(seen)
    # Below the newest whole document older than the cutoff: gone; from it on: kept.
    assert done.revisions >= CHECKPOINT_EVERY * 2
    assert store.document(session_id) == current  # the current state is untouched
    with backend.engine.connect() as conn:
        kept = [
            r[0]
            for r in conn.execute(
                select(revisions.c.revision)
                .where(revisions.c.session_id == session_id)
                .order_by(revisions.c.revision)
            )
        ]
        assert kept == list(range(CHECKPOINT_EVERY * 2, len(seen) + 1))
        for revision in kept:
            assert at_revision(conn, session_id, revision) is not None
        events_left = conn.execute(
            select(func.count()).where(events.c.session_id == session_id)
        ).scalar_one()
        counter = conn.execute(
            select(sessions.c.event_seq).where(sessions.c.session_id == session_id)
        ).scalar_one()
    assert events_left == 0 and counter == 2 * len(seen) + 1  # numbering goes on
    feed = EventFeed(backend.engine, backend.redis)
    assert feed.session_at(store, session_id, kept[0])["revision"] == kept[0]
    snap = store.load_from_database(session_id)
    assert snap is not None
    store.commit(snap, SessionChange(phase=Phase.IDLE, status="active", doc=dict(snap.doc)))
    assert [e["seq"] for e in _events(backend, session_id)] == [counter + 1]


def test_a_session_row_without_records_still_commits(backend: Backend, store: SessionStore) -> None:
    # A session made before the event log (its records backfilled by the migration) or
    # by a first write through update_state_atomic: numbering starts where the row says.
    session_id = uid("s")
    snap = Snapshot(session_id, "", Phase.IDLE, SessionStatus.ACTIVE, 0, {"x": 1}, 0, stored=False)
    doc = {**store.create(uid("s"), "bob").doc, "session_id": session_id}
    store.commit(snap, SessionChange(phase=Phase.IDLE, status="active", doc=doc))
    assert [e["kind"] for e in _events(backend, session_id)] == ["phase_committed"]
    feed = EventFeed(backend.engine, backend.redis)
    assert feed.session_at(store, session_id, 1)["revision"] == 1
