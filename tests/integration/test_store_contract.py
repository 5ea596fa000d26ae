"""Storage contract, run against Postgres and SQLite alike (``db_url`` is parametrized)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select, text

from config import Settings
from state.errors import (
    CorruptStateError,
    FutureVersionError,
    InvalidIdError,
    SessionOwnershipError,
    StaleStateError,
)
from state.migrate import CURRENT_VERSION
from state.session import make_message
from state.sessions.inbox import Inbox
from state.sessions.snapshot import SessionChange
from state.sessions.store import SessionStore
from state.storage.backend import Backend
from state.storage.tables import inbox, messages, quarantine, sessions, user_state
from state.store import PersistentStateManager
from state.workflows.records import ClaimedStep
from state.workflows.spec import parse_spec
from state.workflows.store import WorkflowStore
from tests.support import uid


@pytest.fixture
def backend(settings: Settings) -> Backend:
    return Backend.build(settings)


# Every store implementation for the database: the portable one, and the one the
# runtime picks for it (on Postgres, the one-statement subclass).
IMPLEMENTATIONS = ["portable", "for_engine"]


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


@pytest.fixture(params=IMPLEMENTATIONS)
def inbox_of(backend: Backend, request: pytest.FixtureRequest) -> Inbox:
    if request.param == "portable":
        return Inbox(backend.engine)
    return Inbox.for_engine(backend.engine)


@pytest.fixture
def manager(backend: Backend, settings: Settings) -> PersistentStateManager:
    return PersistentStateManager(backend.redis, backend.engine, settings=settings)


def _count(backend: Backend, table, **where: str) -> int:
    query = select(func.count()).select_from(table)
    for column, value in where.items():
        query = query.where(table.c[column] == value)
    with backend.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def _change(snapshot, phase="planning", messages_=()):
    return SessionChange(
        phase=phase, status="active", doc=dict(snapshot.doc), new_messages=list(messages_)
    )


# -- sessions -------------------------------------------------------------------------


def test_created_session_is_idle_at_revision_zero_and_current_version(store: SessionStore) -> None:
    snap = store.create(uid("s"), "alice")
    assert (snap.phase, snap.revision, snap.user_id) == ("idle", 0, "alice")
    assert snap.doc["_version"] == CURRENT_VERSION
    assert store.create(snap.session_id, "bob").user_id == "alice"  # creating again is a no-op


def test_guarded_commit_bumps_the_version_and_appends_messages(store: SessionStore) -> None:
    snap = store.create(uid("s"), "alice")
    hello = make_message("user", "hello")
    result = store.commit(snap, _change(snap, messages_=[hello]))
    assert result.snapshot.revision == 1
    assert result.snapshot.message_count == 1
    reloaded = store.load_from_database(snap.session_id)
    assert reloaded is not None
    assert (reloaded.phase, reloaded.revision) == ("planning", 1)
    assert [m["content"] for m in store.history(snap.session_id)] == ["hello"]


def test_stale_commit_raises_and_writes_nothing(store: SessionStore, backend: Backend) -> None:
    snap = store.create(uid("s"), "alice")
    store.commit(snap, _change(snap, messages_=[make_message("user", "first")]))
    with pytest.raises(StaleStateError):
        store.commit(snap, _change(snap, "generating", [make_message("user", "late")]))
    reloaded = store.load_from_database(snap.session_id)
    assert reloaded is not None and reloaded.phase == "planning"
    assert [m["content"] for m in store.history(snap.session_id)] == ["first"]
    assert _count(backend, messages, session_id=snap.session_id) == 1


def test_lost_lock_before_commit_rolls_everything_back(store: SessionStore) -> None:
    snap = store.create(uid("s"), "alice")
    with pytest.raises(StaleStateError, match="lock was lost"):
        store.commit(snap, _change(snap, messages_=[make_message("user", "x")]), lambda: False)
    reloaded = store.load_from_database(snap.session_id)
    assert reloaded is not None and reloaded.revision == 0
    assert store.history(snap.session_id) == []


def test_history_tail_reads_only_the_last_items_in_order(store: SessionStore) -> None:
    snap = store.create(uid("s"), "alice")
    items = [make_message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(30)]
    store.commit(snap, _change(snap, messages_=items))
    assert [m["content"] for m in store.history(snap.session_id, last=3)] == ["m27", "m28", "m29"]
    assert len(store.history(snap.session_id)) == 30


def test_accept_message_orders_the_inbox_and_refuses_other_users(
    inbox_of: Inbox, backend: Backend
) -> None:
    session_id = uid("s")
    first = inbox_of.accept(session_id, "alice", "one")
    second = inbox_of.accept(session_id, "alice", "two")
    assert second.seq == first.seq + 1
    with pytest.raises(SessionOwnershipError):
        inbox_of.accept(session_id, "mallory", "let me in")
    assert _count(backend, inbox, session_id=session_id) == 2
    queued = inbox_of.next_queued(session_id)
    assert queued is not None and queued.text == "one"
    assert inbox_of.queued_count(session_id) == 2


def test_legacy_session_document_is_migrated_on_load_and_written_back(
    store: SessionStore, backend: Backend
) -> None:
    session_id = uid("legacy")
    legacy = {
        "session_id": session_id,
        "user_id": "old-user",
        "status": "active",
        "message_history": [
            {"role": "user", "content": "hi", "ts": "2024-01-01T00:00:00"},
            {"role": "assistant", "content": "hello", "ts": "2024-01-01T00:00:01"},
        ],
    }
    with backend.engine.begin() as conn:
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                user_id="old-user",
                doc=json.dumps(legacy),
                created_at=func.now(),
                updated_at=func.now(),
            )
        )
    snap = store.load_from_database(session_id)
    assert snap is not None
    assert snap.doc["_version"] == CURRENT_VERSION and snap.doc["tool_results"] == []
    assert "message_history" not in snap.doc
    history = store.history(session_id)
    assert history[0] == {
        "role": "user",
        "content": "hi",
        "timestamp": "2024-01-01T00:00:00",
        "metadata": {},
        "seq": 0,
    }
    with backend.engine.connect() as conn:
        stored = json.loads(
            conn.execute(
                select(sessions.c.doc).where(sessions.c.session_id == session_id)
            ).scalar_one()
        )
    assert stored["_version"] == CURRENT_VERSION and "message_history" not in stored


def test_future_session_document_is_refused_and_left_untouched(
    store: SessionStore, backend: Backend
) -> None:
    session_id = uid("future")
    raw = json.dumps({"session_id": session_id, "_version": CURRENT_VERSION + 1, "new": 1})
    with backend.engine.begin() as conn:
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                user_id="u",
                doc=raw,
                created_at=func.now(),
                updated_at=func.now(),
            )
        )
    with pytest.raises(FutureVersionError):
        store.load_from_database(session_id)
    with backend.engine.connect() as conn:
        stored = conn.execute(
            select(sessions.c.doc).where(sessions.c.session_id == session_id)
        ).scalar_one()
    assert json.loads(stored) == json.loads(raw)


def test_malformed_session_document_is_quarantined_not_a_crash_loop(
    store: SessionStore, backend: Backend
) -> None:
    session_id = uid("bad")
    raw = json.dumps({"session_id": session_id, "_version": 3, "context_window": [1, 2]})
    with backend.engine.begin() as conn:
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                user_id="u",
                doc=raw,
                created_at=func.now(),
                updated_at=func.now(),
            )
        )
    snap = store.load_from_database(session_id)
    assert snap is not None and snap.phase == "idle"
    assert "quarantined" in snap.doc["metadata"]
    assert _count(backend, quarantine, key=session_id) == 1
    again = store.load_from_database(session_id)  # loads cleanly from now on
    assert again is not None and again.revision == snap.revision


# -- user state (layer 3) --------------------------------------------------------------


def test_user_state_round_trip_and_unknown_user(manager: PersistentStateManager) -> None:
    user = uid("u")
    assert manager.load_user_state(user) == {}
    manager.save_user_state(user, {"likes": "tea", "n": 1})
    loaded = manager.load_user_state(user)
    assert loaded["likes"] == "tea" and loaded["_version"] == CURRENT_VERSION
    manager.save_user_state(user, {"likes": "coffee"})
    assert manager.load_user_state(user)["likes"] == "coffee"


def test_user_ids_are_validated(manager: PersistentStateManager) -> None:
    with pytest.raises(InvalidIdError):
        manager.save_user_state("no spaces", {})
    with pytest.raises(InvalidIdError):
        manager.load_user_state("x" * 129)


def test_legacy_user_row_inserted_with_raw_sql_is_migrated_and_written_back(
    manager: PersistentStateManager, backend: Backend
) -> None:
    user = uid("legacy")
    legacy = {"message_history": [{"role": "user", "content": "hi", "ts": "2020-01-01"}]}
    with backend.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO user_state (user_id, state, updated_at) "
                "VALUES (:u, :s, CURRENT_TIMESTAMP)"
            ),
            {"u": user, "s": json.dumps(legacy)},
        )
    loaded = manager.load_user_state(user)
    assert loaded["_version"] == CURRENT_VERSION
    assert loaded["tool_results"] == []
    assert loaded["message_history"][0]["timestamp"] == "2020-01-01"
    with backend.engine.connect() as conn:
        stored = json.loads(
            conn.execute(
                select(user_state.c.state).where(user_state.c.user_id == user)
            ).scalar_one()
        )
    assert stored["_version"] == CURRENT_VERSION


def test_future_user_state_is_refused_and_its_row_unchanged(
    manager: PersistentStateManager, backend: Backend
) -> None:
    user = uid("future")
    raw = json.dumps({"_version": CURRENT_VERSION + 5, "shape": "from the future"})
    with backend.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO user_state (user_id, state, updated_at) "
                "VALUES (:u, :s, CURRENT_TIMESTAMP)"
            ),
            {"u": user, "s": raw},
        )
    with pytest.raises(FutureVersionError):
        manager.load_user_state(user)
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(user_state.c.state, user_state.c.revision).where(user_state.c.user_id == user)
        ).one()
    assert json.loads(row[0]) == json.loads(raw) and row[1] == 0


def test_corrupt_user_state_is_reported_quarantined_then_empty(
    manager: PersistentStateManager, backend: Backend
) -> None:
    user = uid("corrupt")
    with backend.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO user_state (user_id, state, updated_at) "
                "VALUES (:u, :s, CURRENT_TIMESTAMP)"
            ),
            {"u": user, "s": json.dumps([1, 2, 3])},  # valid JSON, wrong type
        )
    with pytest.raises(CorruptStateError):
        manager.load_user_state(user)
    assert _count(backend, quarantine, key=user) == 1
    reloaded = manager.load_user_state(user)  # no crash loop: an empty state from now on
    assert {k: v for k, v in reloaded.items() if k != "_version"} == {}


def test_update_user_state_applies_every_change(manager: PersistentStateManager) -> None:
    user = uid("u")
    for n in range(5):
        manager.update_user_state(user, lambda s, n=n: {**s, "seen": [*s.get("seen", []), n]})
    assert manager.load_user_state(user)["seen"] == [0, 1, 2, 3, 4]


# -- workflows (layer 2) ---------------------------------------------------------------


def _diamond(workflow_id: str):
    return parse_spec(
        {
            "workflow_id": workflow_id,
            "steps": [
                {"step_id": "a", "action": "echo"},
                {"step_id": "b", "action": "echo", "dependencies": ["a"]},
                {"step_id": "c", "action": "echo", "dependencies": ["a"]},
                {"step_id": "d", "action": "echo", "dependencies": ["b", "c"]},
            ],
        }
    )


def test_step_claims_are_exclusive_and_completion_releases_dependents(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id = uid("wf")
    assert wfs.create(_diamond(workflow_id)) == [("a", 0)]
    claimed = wfs.claim(workflow_id, "a", 0, lease_s=30)
    assert claimed is not None
    assert wfs.claim(workflow_id, "a", 0, lease_s=30) is None  # a duplicate delivery
    assert wfs.claim(workflow_id, "b", 0, lease_s=30) is None  # not ready yet
    completion = wfs.succeed(claimed, {"value": 1})
    assert sorted(completion.ready) == [("b", 0), ("c", 0)]
    with pytest.raises(StaleStateError):
        wfs.succeed(claimed, {"value": 2})  # completing twice is refused
    b = wfs.claim(workflow_id, "b", 0, lease_s=30)
    c = wfs.claim(workflow_id, "c", 0, lease_s=30)
    assert b is not None and c is not None
    assert wfs.succeed(b, {}).ready == []
    assert wfs.succeed(c, {}).ready == [("d", 0)]
    d = wfs.claim(workflow_id, "d", 0, lease_s=30)
    assert d is not None
    finished = wfs.succeed(d, {"done": True}).finished
    assert finished is not None and finished.status == "success"
    doc = wfs.document(workflow_id)
    assert doc is not None and doc["status"] == "success"
    assert doc["steps"]["a"]["outputs"] == {"value": 1}


def test_a_failed_step_skips_its_downstream_and_fails_the_workflow(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id = uid("wf")
    spec = {
        "workflow_id": workflow_id,
        "steps": [
            {"step_id": "a", "action": "echo"},
            {"step_id": "b", "action": "echo", "dependencies": ["a"]},
            {"step_id": "c", "action": "echo", "dependencies": ["b"]},
            {"step_id": "x", "action": "echo"},
        ],
    }
    wfs.create(parse_spec(spec))
    a = wfs.claim(workflow_id, "a", 0, lease_s=30)
    x = wfs.claim(workflow_id, "x", 0, lease_s=30)
    assert a is not None and x is not None
    assert wfs.fail(a, "boom").finished is None
    finished = wfs.succeed(x, {}).finished
    assert finished is not None and finished.status == "failed"
    doc = wfs.document(workflow_id)
    assert doc is not None
    statuses = {sid: s["status"] for sid, s in doc["steps"].items()}
    assert statuses == {"a": "failed", "b": "skipped", "c": "skipped", "x": "success"}


def test_retry_moves_the_version_so_the_old_claim_is_dead(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id = uid("wf")
    wfs.create(
        parse_spec({"workflow_id": workflow_id, "steps": [{"step_id": "a", "action": "echo"}]})
    )
    first = wfs.claim(workflow_id, "a", 0, lease_s=30)
    assert first is not None
    revision = wfs.retry(first, "flaky")
    assert wfs.claim(workflow_id, "a", first.revision, lease_s=30) is None
    second = wfs.claim(workflow_id, "a", revision, lease_s=30)
    assert second is not None and second.retry_count == 1
    with pytest.raises(StaleStateError):
        wfs.succeed(first, {})


def test_a_redelivered_task_finds_what_its_lost_commit_left_to_do(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id = uid("wf")
    wfs.create(_diamond(workflow_id))
    claimed = wfs.claim(workflow_id, "a", 0, lease_s=30, task_id="task-a")
    assert claimed is not None
    # While the claim's lease runs, a redelivery must not run the step a second time.
    assert wfs.leftover(workflow_id, "a", "task-a") is None
    wfs.heartbeat(claimed, lease_s=-1)  # the lease lapses: the first delivery is gone
    # The claim committed but its acknowledgement was lost: the same task finds its claim.
    left = wfs.leftover(workflow_id, "a", "task-a")
    assert left is not None and left.claimed is not None and left.claimed.revision == 1
    assert wfs.leftover(workflow_id, "a", "another-task") is None
    from dataclasses import replace

    wfs.succeed(replace(claimed, task_id="task-a"), {"value": 1})
    # Its completion committed but the dispatch of b and c was lost: both are found again.
    left = wfs.leftover(workflow_id, "a", "task-a")
    assert left is not None and left.completion is not None
    assert sorted(left.completion.ready) == [("b", 0), ("c", 0)]


def test_a_quick_step_runs_from_a_peek_and_commits_once(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id = uid("wf")
    wfs.create(_diamond(workflow_id))
    assert wfs.peek(workflow_id, "b", 0) is None  # not ready yet
    assert wfs.peek(workflow_id, "a", 1) is None  # not at that revision
    first = wfs.peek(workflow_id, "a", 0)
    second = wfs.peek(workflow_id, "a", 0)  # a duplicate delivery, at the same time
    assert first is not None and second is not None
    assert first.revision == 0 and sorted(first.dependents or []) == ["b", "c"]
    doc = wfs.document(workflow_id)
    assert doc is not None and doc["steps"]["a"]["status"] == "pending"  # nothing written
    completion = wfs.succeed_unclaimed(first, {"value": 1})
    assert sorted(completion.ready) == [("b", 0), ("c", 0)]
    with pytest.raises(StaleStateError):
        wfs.succeed_unclaimed(second, {"value": 2})  # the other delivery commits nothing
    assert wfs.peek(workflow_id, "a", 0) is None and wfs.peek(workflow_id, "a", 1) is None
    b = wfs.peek(workflow_id, "b", 0)
    assert b is not None and b.dep_outputs in (None, {"a": {"value": 1}})
    wfs.succeed_unclaimed(b, {})
    c = wfs.claim(workflow_id, "c", 0, lease_s=30)  # quick and claimed steps mix
    assert c is not None
    assert wfs.succeed(c, {}).ready == [("d", 0)]
    d = wfs.peek(workflow_id, "d", 0)
    assert d is not None
    finished = wfs.succeed_unclaimed(d, {"done": True}).finished
    assert finished is not None and finished.status == "success"
    doc = wfs.document(workflow_id)
    assert doc is not None and doc["steps"]["a"]["outputs"] == {"value": 1}
    assert doc["steps"]["a"]["started_at"] is not None


def test_steps_that_need_their_claim_are_not_peeked(backend: Backend, wfs: WorkflowStore) -> None:
    workflow_id = uid("wf")
    spec = {
        "workflow_id": workflow_id,
        "steps": [
            {"step_id": "timed", "action": "echo", "timeout_s": 5},
            {"step_id": "timer", "action": "echo", "not_before_s": 0.01},
            {"step_id": "asks", "action": "echo", "approval": True},
            {"step_id": "running", "action": "echo"},
        ],
    }
    wfs.create(parse_spec(spec))
    assert wfs.claim(workflow_id, "running", 0, lease_s=30) is not None
    for step_id, revision in (("timed", 0), ("timer", 0), ("asks", 0), ("running", 1)):
        assert wfs.peek(workflow_id, step_id, revision) is None, step_id


def _peeked_root(wfs: WorkflowStore) -> tuple[str, ClaimedStep]:
    """A new diamond workflow and its root step as a quick action's run reads it."""
    workflow_id = uid("wf")
    wfs.create(_diamond(workflow_id))
    peeked = wfs.peek(workflow_id, "a", 0)
    assert peeked is not None
    return workflow_id, peeked


def test_a_quick_step_cancelled_while_it_runs_commits_nothing(
    backend: Backend, wfs: WorkflowStore
) -> None:
    workflow_id, peeked = _peeked_root(wfs)
    assert wfs.cancel_workflow(workflow_id) is not None
    with pytest.raises(StaleStateError):
        wfs.succeed_unclaimed(peeked, {"value": 1})
    doc = wfs.document(workflow_id)
    assert doc is not None and doc["status"] == "cancelled"
    assert doc["steps"]["a"]["outputs"] == {}


def test_a_redelivered_quick_step_finds_what_its_lost_commit_left_to_do(
    backend: Backend, wfs: WorkflowStore
) -> None:
    from dataclasses import replace

    workflow_id, peeked = _peeked_root(wfs)
    wfs.succeed_unclaimed(replace(peeked, task_id="task-a"), {"value": 1})
    left = wfs.leftover(workflow_id, "a", "task-a")
    assert left is not None and left.completion is not None
    assert sorted(left.completion.ready) == [("b", 0), ("c", 0)]
