"""Retention's floors (issue #47) on Postgres and SQLite: a prune keeps each session's
newest checkpoint older than the cutoff and everything after it, every kept revision
reads as it did before (time travel, forks), a second run finds nothing, and when a
newer checkpoint ages past the cutoff the floor moves up to it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from config import Settings
from state.clock import utcnow
from state.events.feed import EventFeed
from state.events.fork import fork_session
from state.events.retention import prune
from state.events.revisions import CHECKPOINT_EVERY, PastRevision, at_revision
from state.sessions.inbox import Inbox
from state.sessions.store import SessionStore
from state.storage.backend import Backend
from state.storage.tables import revisions
from tests.integration.test_event_log import IMPLEMENTATIONS, _commits
from tests.support import uid


@pytest.fixture
def backend(settings: Settings) -> Backend:
    return Backend.build(settings)


@pytest.fixture(params=IMPLEMENTATIONS)
def store(backend: Backend, request: pytest.FixtureRequest) -> SessionStore:
    if request.param == "portable":
        return SessionStore(backend.engine, backend.cache)
    return SessionStore.for_engine(backend.engine, backend.cache)


def _age(backend: Backend, session_id: str, through: int) -> None:
    """Make the session's revision records up to ``through`` 40 days old."""
    old = utcnow() - timedelta(days=40)
    with backend.engine.begin() as conn:
        conn.execute(
            update(revisions)
            .where(revisions.c.session_id == session_id, revisions.c.revision <= through)
            .values(at=old)
        )


def _kept(backend: Backend, session_id: str) -> list[int]:
    with backend.engine.connect() as conn:
        return [
            int(r[0])
            for r in conn.execute(
                select(revisions.c.revision)
                .where(revisions.c.session_id == session_id)
                .order_by(revisions.c.revision)
            )
        ]


def _past(backend: Backend, session_id: str, numbers: list[int]) -> dict[int, PastRevision | None]:
    with backend.engine.connect() as conn:
        return {n: at_revision(conn, session_id, n) for n in numbers}


def test_the_floor_keeps_every_kept_revision_readable_and_moves_up(
    backend: Backend, store: SessionStore
) -> None:
    session_id, other = uid("s"), uid("s")
    for sid in (session_id, other):
        Inbox(backend.engine).accept(sid, "alice", "hello")
    last = len(_commits(store, session_id, CHECKPOINT_EVERY * 3 + 5))
    _commits(store, other, 10)
    before = _past(backend, session_id, list(range(last + 1)))
    _age(backend, session_id, CHECKPOINT_EVERY * 2 + 16)  # checkpoints 32 and 64 aged
    cutoff = utcnow() - timedelta(days=30)

    floor = CHECKPOINT_EVERY * 2
    assert prune(backend.engine, cutoff, batch=1).revisions == floor  # revisions 0..63
    assert _kept(backend, session_id) == list(range(floor, last + 1))
    assert _past(backend, session_id, list(range(floor, last + 1))) == {
        n: before[n] for n in range(floor, last + 1)
    }
    assert _past(backend, session_id, [floor - 1]) == {floor - 1: None}
    assert len(_kept(backend, other)) == 11  # nothing of it was old
    feed = EventFeed(backend.engine, backend.redis)
    assert feed.session_at(store, session_id, floor)["revision"] == floor
    fork = fork_session(backend.engine, session_id, floor + 3, uid("f"))
    forked_at = before[floor + 3]
    assert forked_at is not None
    assert store.document(fork)["context_window"] == forked_at.doc["context_window"]

    assert prune(backend.engine, cutoff).revisions == 0  # nothing due: nothing deleted

    _age(backend, session_id, CHECKPOINT_EVERY * 3 + 1)  # checkpoint 96 aged too
    assert prune(backend.engine, cutoff).revisions == CHECKPOINT_EVERY
    floor = CHECKPOINT_EVERY * 3
    assert _kept(backend, session_id) == list(range(floor, last + 1))
    assert _past(backend, session_id, list(range(floor, last + 1))) == {
        n: before[n] for n in range(floor, last + 1)
    }
    assert store.document(fork)["context_window"] == forked_at.doc["context_window"]
