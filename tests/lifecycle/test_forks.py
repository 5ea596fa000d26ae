"""Forks share their source's history instead of copying it, through real workers and
Postgres: a fork of ~2 MB of history costs a few KiB, reads exactly as the source did at
that revision (paged, and in the past too), goes on by itself, and stays readable when
its source is pruned; erasing the user takes source and forks alike."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert, text, update

from state.clock import utcnow
from state.lifecycle import retention
from state.storage import keys
from state.storage.tables import messages, sessions
from tasks.client import AgentClient
from tests.lifecycle.scan import rows_naming
from tests.lifecycle.test_erase import phase_of, wait_until
from tests.support import uid

pytestmark = pytest.mark.workers
BIG = 50_000  # characters per synthetic message
SYNTHETIC = 40  # 40 x 50 kB: ~2 MB of history


def database_bytes(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relkind = 'r' AND n.nspname = current_schema()"
                )
            ).scalar_one()
        )


def grow(client: AgentClient, session_id: str) -> None:
    """Give the (resting) session ~2 MB more history, as long conversations have."""
    engine = client.backend.engine
    start = len(history(client.get_session(session_id)))
    with engine.begin() as conn:
        conn.execute(
            insert(messages),
            [
                {
                    "session_id": session_id,
                    "seq": start + i,
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"{i} " + "x" * BIG,
                    "timestamp": "2026-12-03T00:00:00+00:00",
                    "metadata": "{}",
                }
                for i in range(SYNTHETIC)
            ],
        )
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(message_count=start + SYNTHETIC)
        )
    client.backend.redis.delete(keys.session_cache(session_id))


def history(doc: dict[str, Any] | None) -> list[Any]:
    assert doc is not None
    return list(doc["message_history"])


def test_a_fork_shares_the_history_and_reads_as_the_source_did(client: AgentClient) -> None:
    user, source = uid("u"), uid("src")
    client.send_message(source, "what is 2*3?", user_id=user)
    client.wait_for_idle(source, timeout=60)
    grow(client, source)
    client.send_message(source, "what is 4*5?", user_id=user)
    client.wait_for_idle(source, timeout=60)
    revision = client.revisions(source)[-1]["revision"]
    then = client.get_session(source, revision=revision)
    assert then is not None and len(history(then)) == 2 + SYNTHETIC + 2
    engine = client.backend.engine
    client.send_message(source, "what is 7*8?", user_id=user)  # the source goes on
    client.wait_for_idle(source, timeout=60)

    before = database_bytes(engine)
    fork = client.fork_session(source, revision, uid("fork"))
    grown = database_bytes(engine) - before
    print(f"\nfork of {SYNTHETIC * BIG / 1e6:.1f} MB of history grew the database by {grown} B")
    assert grown < 128 * 1024, grown

    now = client.get_session(fork)
    assert history(now) == history(then)
    for limit in (1, 5):
        page = client.get_session(fork, history_limit=limit, before_seq=SYNTHETIC)
        assert history(page) == history(then)[SYNTHETIC - limit : SYNTHETIC]
    assert history(client.get_session(fork, history_limit=3)) == history(then)[-3:]

    # The fork goes on by itself; its past reads as it was, paged as the present.
    client.send_message(fork, "what is 9*9?", user_id=user)
    after = client.wait_for_idle(fork, timeout=60)
    assert history(after)[:-2] == history(then)
    assert history(after)[-1]["content"] == "9*9 = 81"
    fork_revisions = client.revisions(fork)
    assert history(client.get_session(fork, revision=fork_revisions[0]["revision"])) == history(
        then
    )
    past = client.get_session(fork, revision=fork_revisions[0]["revision"], history_limit=2)
    assert history(past) == history(then)[-2:]

    # A fork of the fork reads the first source's rows too, and what the fork added.
    second = client.fork_session(fork, fork_revisions[-1]["revision"], uid("fork2"))
    assert history(client.get_session(second)) == history(after)

    # The source is pruned: every fork still reads the same.
    with engine.begin() as conn:
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == source)
            .values(updated_at=utcnow() - timedelta(days=2))
        )
    pruned = retention.prune_all(
        engine,
        client.backend.redis,
        client.settings.model_copy(update={"sessions_retain_days": 1.0}),
    )
    assert pruned["sessions"] >= 1 and client.get_session(source) is None
    assert history(client.get_session(fork)) == history(after)
    assert history(client.get_session(second)) == history(after)
    # Only the forks' own logs still name it (their ``forked`` events).
    assert set(rows_naming(engine, [source])) <= {"events"}

    counts = client.erase_user(user)
    assert counts["sessions"] == 2, counts
    assert client.get_session(fork) is None and client.get_session(second) is None


def test_revisions_page(client: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    for text_ in ("what is 1+1?", "what is 2+2?", "what is 3+3?"):
        client.send_message(session_id, text_, user_id=user)
        client.wait_for_idle(session_id, timeout=60)
    every = client.revisions(session_id)
    assert len(every) > 4
    paged: list[Any] = []
    after = 0
    while True:
        page = client.revisions(session_id, after=after, limit=2)
        if not page:
            break
        assert len(page) <= 2
        paged += page
        after = page[-1]["revision"]
    assert paged == every
    # The past pages as the present: after the second answer, the newest item, then the
    # one before it.
    second = next(
        r["revision"]
        for r in every
        if r["revision"] > 0 and _items(client, session_id, r["revision"]) == 4
    )
    whole = client.get_session(session_id, revision=second)
    newest = client.get_session(session_id, revision=second, history_limit=1)
    assert history(newest) == history(whole)[-1:]
    older = client.get_session(
        session_id, revision=second, history_limit=1, before_seq=history(newest)[0]["seq"]
    )
    assert history(older) == history(whole)[-2:-1]
    assert history(client.get_session(session_id, revision=second, history_limit=0)) == []
    for bad in ({"limit": 0}, {"limit": 1001}, {"after": -1}, {"limit": "2"}):
        with pytest.raises(Exception) as caught:
            client.revisions(session_id, **bad)
        assert type(caught.value).__name__.endswith("Error")
    with pytest.raises(Exception) as caught:
        client.get_session(session_id, revision=1, history_limit=-1)
    assert "history_limit" in str(caught.value)


def _items(client: AgentClient, session_id: str, revision: int) -> int:
    return len(history(client.get_session(session_id, revision=revision)))


def test_a_fork_keeps_what_a_rollback_removes_from_its_source(client: AgentClient) -> None:
    user, source = uid("u"), uid("src")
    client.send_message(source, "what is 1+1?", user_id=user)
    client.wait_for_idle(source, timeout=60)
    client.send_message(source, "linger a while", user_id=user)
    wait_until(lambda: phase_of(client, source) == "executing")
    revision = client.revisions(source)[-1]["revision"]
    then = client.get_session(source, revision=revision)
    assert "linger a while" in [m["content"] for m in history(then)]
    fork = client.fork_session(source, revision, uid("fork"))
    client.send_message(source, "what is 2+2?", user_id=user, multitask_strategy="rollback")
    now = client.wait_for_idle(source, timeout=60)
    assert "linger a while" not in [m["content"] for m in history(now)]
    assert history(client.get_session(fork)) == history(then)
