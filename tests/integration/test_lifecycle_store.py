"""Erasure, retention and shared fork history on each backend (Postgres and SQLite), in
process: no workers, the rows as the client stores them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, select, update

from config import Settings
from state.clock import utcnow
from state.errors import BadInputError
from state.lifecycle.retention import prune_all
from state.storage.tables import Base, inbox, messages, sessions
from tasks.client import AgentClient
from tests.support import uid


def naming(engine: Engine, ids: list[str]) -> list[str]:
    """``table: row`` for each row of any table that contains one of ``ids``."""
    found = []
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            for row in conn.execute(select(table)):
                text = repr(tuple(row))
                found += [f"{table.name}: {text}" for name in ids if name in text]
    return found


@pytest.fixture
def agent(settings: Settings) -> AgentClient:
    return AgentClient(settings)


def test_erase_deletes_every_row_of_the_user_and_only_theirs(agent: AgentClient) -> None:
    gone, kept = uid("gone"), uid("kept")
    mine, theirs = uid("s"), uid("s")
    agent.send_message(mine, "hello", user_id=gone)
    agent.send_message(theirs, "hello", user_id=kept)
    fork = agent.fork_session(mine, 0, uid("fork"))
    agent.save_user_state(gone, {"facts": ["x"]})
    agent.save_user_state(kept, {"facts": ["y"]})
    before = naming(agent.backend.engine, [kept, theirs])
    counts = agent.erase_user(gone)
    assert counts["sessions"] == 2 and counts["user_state"] == 1, counts
    assert counts["inbox"] == 1 and counts["events"] >= 2, counts
    assert naming(agent.backend.engine, [gone, mine, fork]) == []
    assert naming(agent.backend.engine, [kept, theirs]) == before
    assert set(agent.erase_user(gone).values()) == {0}
    with pytest.raises(BadInputError):
        agent.erase_user("no spaces allowed")


def test_a_pruned_source_leaves_its_forks_readable(agent: AgentClient) -> None:
    user, source = uid("u"), uid("src")
    agent.send_message(source, "hello", user_id=user)
    engine = agent.backend.engine
    with engine.begin() as conn:  # as if two turns had answered it
        conn.execute(
            messages.insert(),
            [
                {
                    "session_id": source,
                    "seq": i,
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"m{i}",
                    "timestamp": "t",
                    "metadata": "{}",
                }
                for i in range(4)
            ],
        )
        conn.execute(
            update(sessions).where(sessions.c.session_id == source).values(message_count=4)
        )
    agent.sessions.cache.evict(f"agentstate:session:{{{source}}}:cache")
    # Forks at revision 0 share nothing (the history was empty then); share 4 by hand.
    forks = [agent.fork_session(source, 0, uid("fork")) for _ in range(3)]
    with engine.begin() as conn:
        for n, fork in enumerate(forks):
            conn.execute(
                update(sessions)
                .where(sessions.c.session_id == fork)
                .values(prefix_session_id=source, prefix_count=n + 2, message_count=n + 2)
            )
    expected = {f: [f"m{i}" for i in range(n + 2)] for n, f in enumerate(forks)}
    read = lambda f: [m["content"] for m in agent.get_session(f)["message_history"]]  # type: ignore[index]  # noqa: E731
    assert {f: read(f) for f in forks} == expected
    with engine.begin() as conn:  # answered long ago (no worker runs here)
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == source)
            .values(updated_at=utcnow() - timedelta(days=3))
        )
        conn.execute(update(inbox).where(inbox.c.session_id == source).values(state="answered"))
    aged = agent.settings.model_copy(update={"sessions_retain_days": 1.0})
    assert prune_all(engine, agent.backend.redis, aged)["sessions"] == 1
    assert {f: read(f) for f in forks} == expected
    with engine.connect() as conn:
        holders = {
            r[0]: r[1]
            for r in conn.execute(
                select(sessions.c.session_id, sessions.c.prefix_session_id).where(
                    sessions.c.session_id.in_(forks)
                )
            )
        }
    # The fork that shared the most holds the rows; the others read from it.
    assert holders == {forks[2]: None, forks[0]: forks[2], forks[1]: forks[2]}
