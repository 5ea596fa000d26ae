"""The OpenAI Agents SDK's ``Session`` contract on agentstate (``AgentstateSession``), on
Postgres and on SQLite with real Redis: get (all, the newest n, the settings' limit), add,
pop, clear; the items are the session's history (read back exactly, shown in
``get_session``, told in the event log); another user's object reads nothing and its
writes raise NotFoundError, changing no row; bad input stores nothing; a busy session is
refused; forks keep their own copy; ``erase_user`` leaves nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents.memory import Session, SessionSettings
from sqlalchemy import func, select

from config import Settings
from state.errors import (
    InvalidIdError,
    InvalidPayloadError,
    NotFoundError,
    SessionBusyError,
)
from state.storage.db import read_connection
from state.storage.tables import events, messages, sessions
from tasks.client import AgentClient, AsyncAgentClient
from tasks.integrations.openai_agents import AgentstateSession
from tests.support import make_settings, uid

CALL: dict[str, Any] = {
    "type": "function_call",
    "call_id": "call-1",
    "name": "order_status",
    "arguments": '{"order_id": "1234"}',
}
OUTPUT: dict[str, Any] = {
    "type": "function_call_output",
    "call_id": "call-1",
    "output": "shipped",
}
ANSWER: dict[str, Any] = {
    "id": "msg-1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "It shipped.", "annotations": []}],
}


@pytest.fixture
def client(db_url: str) -> Iterator[AgentClient]:
    yield AgentClient(make_settings(db_url, queue=uid("q")))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _rows(client: AgentClient, session_id: str) -> tuple[int, int, int]:
    """History rows, events and the revision of ``session_id``."""
    with read_connection(client.backend.engine) as conn:
        count = conn.execute(
            select(func.count()).where(messages.c.session_id == session_id)
        ).scalar_one()
        logged = conn.execute(
            select(func.count()).where(events.c.session_id == session_id)
        ).scalar_one()
        revision = conn.execute(
            select(sessions.c.revision).where(sessions.c.session_id == session_id)
        ).scalar()
    return int(count), int(logged), int(revision or 0)


def test_it_is_the_sdks_session_and_keeps_items_exactly(client: AgentClient) -> None:
    session = AgentstateSession(uid("s"), uid("u"), client=client)
    assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
    question = {"role": "user", "content": "Where is order 1234?"}
    assert run(session.get_items()) == []
    run(session.add_items([question, CALL]))
    run(session.add_items([OUTPUT, ANSWER]))
    assert run(session.get_items()) == [question, CALL, OUTPUT, ANSWER]
    assert run(session.get_items(limit=2)) == [OUTPUT, ANSWER]
    assert run(session.get_items(limit=10)) == [question, CALL, OUTPUT, ANSWER]
    assert run(session.get_items(limit=0)) == []
    limited = AgentstateSession(
        session.session_id, session.user_id, client, SessionSettings(limit=1)
    )
    assert run(limited.get_items()) == [ANSWER]
    assert run(limited.get_items(limit=3)) == [CALL, OUTPUT, ANSWER]


def test_pop_removes_the_newest_and_clear_removes_all(client: AgentClient) -> None:
    session = AgentstateSession(uid("s"), uid("u"), client=client)
    assert run(session.pop_item()) is None  # nothing there: nothing created either
    assert client.get_session(session.session_id) is None
    items = [{"role": "user", "content": f"q{n}"} for n in range(3)]
    run(session.add_items(items))
    assert run(session.pop_item()) == items[2]
    assert run(session.get_items()) == items[:2]
    more = {"role": "user", "content": "q3"}
    run(session.add_items([more]))
    assert run(session.get_items()) == [*items[:2], more]
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    run(session.clear_session())  # clearing an empty session changes nothing
    run(session.add_items([more]))
    assert run(session.get_items()) == [more]


def test_items_are_the_sessions_history_and_its_events(client: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    session = AgentstateSession(session_id, user, client=client)
    run(session.add_items([{"role": "user", "content": "Where is order 1234?"}, CALL]))
    run(session.add_items([OUTPUT, ANSWER]))
    run(session.pop_item())
    doc = client.get_session(session_id, user_id=user)
    assert doc is not None and doc["user_id"] == user and doc["phase"] == "idle"
    shown = [(m["role"], m["content"]) for m in doc["message_history"]]
    assert shown == [
        ("user", "Where is order 1234?"),
        ("tool", '[function_call] order_status({"order_id": "1234"})'),
        ("tool", "[function_call_output] shipped"),
    ]
    logged = [(e["kind"], e["data"]) for e in client.events(session_id, user_id=user)]
    changes = [(kind, data) for kind, data in logged if kind.startswith("history_")]
    assert changes == [
        ("history_added", {"count": 2, "source": "openai-agents"}),
        ("history_added", {"count": 2, "source": "openai-agents"}),
        ("history_removed", {"count": 1, "source": "openai-agents"}),
    ]
    assert [r["trigger"] for r in client.revisions(session_id)][-1] == "openai-agents"


def test_another_users_object_reads_nothing_and_changes_nothing(client: AgentClient) -> None:
    owner, session_id = uid("u"), uid("s")
    mine = AgentstateSession(session_id, owner, client=client)
    run(mine.add_items([{"role": "user", "content": "secret"}]))
    before = _rows(client, session_id)
    theirs = AgentstateSession(session_id, uid("mallory"), client=client)
    assert run(theirs.get_items()) == []
    assert run(theirs.get_items(limit=1)) == []
    for write in (
        lambda: theirs.add_items([{"role": "user", "content": "mine now"}]),
        theirs.pop_item,
        theirs.clear_session,
    ):
        with pytest.raises(NotFoundError):
            run(write())
    assert _rows(client, session_id) == before
    assert run(mine.get_items()) == [{"role": "user", "content": "secret"}]


def test_bad_input_stores_nothing(client: AgentClient, db_url: str) -> None:
    session = AgentstateSession(uid("s"), uid("u"), client=client)
    run(session.add_items([{"role": "user", "content": "first"}]))
    before = _rows(client, session.session_id)
    for items in (
        [{"role": "user", "content": "ok"}, "not an object"],
        [{"role": "user", "content": "nul \x00"}],
        [{"role": "user", "content": float("nan")}],
    ):
        with pytest.raises(InvalidPayloadError):
            run(session.add_items(items))  # type: ignore[arg-type]
    small = AgentClient(make_settings(db_url, max_step_io_bytes=100))
    capped = AgentstateSession(session.session_id, session.user_id, client=small)
    with pytest.raises(InvalidPayloadError, match="AGENTSTATE_MAX_STEP_IO_BYTES"):
        run(capped.add_items([{"role": "user", "content": "x" * 200}]))
    with pytest.raises(InvalidPayloadError, match="limit"):
        run(session.get_items(limit=-1))
    assert _rows(client, session.session_id) == before
    with pytest.raises(InvalidIdError):
        AgentstateSession("bad id!", "u")
    with pytest.raises(InvalidIdError):
        AgentstateSession("s", "")


def test_a_busy_session_is_refused(client: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    session = AgentstateSession(session_id, user, client=client)
    run(session.add_items([{"role": "user", "content": "first"}]))
    client.send_message(session_id, "waits for a worker", user_id=user)  # none runs here
    before = _rows(client, session_id)
    for write in (
        lambda: session.add_items([{"role": "user", "content": "more"}]),
        session.pop_item,
        session.clear_session,
    ):
        with pytest.raises(SessionBusyError):
            run(write())
    assert _rows(client, session_id) == before


def test_a_fork_keeps_its_own_copy(client: AgentClient) -> None:
    user, source_id, fork_id = uid("u"), uid("s"), uid("f")
    source = AgentstateSession(source_id, user, client=client)
    items = [{"role": "user", "content": f"q{n}"} for n in range(3)]
    run(source.add_items(items))
    revision = client.revisions(source_id)[-1]["revision"]
    client.fork_session(source_id, revision, fork_id)
    fork = AgentstateSession(fork_id, user, client=client)
    assert run(fork.get_items()) == items
    assert run(fork.pop_item()) == items[2]  # shared from the source: shared no more
    assert run(source.get_items()) == items
    assert run(source.pop_item()) == items[2]
    run(source.clear_session())
    assert run(fork.get_items()) == items[:2]
    run(fork.add_items([{"role": "user", "content": "fork"}]))
    assert run(fork.get_items()) == [*items[:2], {"role": "user", "content": "fork"}]
    assert run(source.get_items()) == []


def test_nothing_is_left_after_erase_user(client: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    session = AgentstateSession(session_id, user, client=client)
    run(session.add_items([{"role": "user", "content": "my address is ..."}, ANSWER]))
    erased = client.erase_user(user)
    assert erased["sessions"] == 1 and erased["messages"] == 2
    assert _rows(client, session_id) == (0, 0, 0)
    assert run(session.get_items()) == []
    assert client.get_session(session_id) is None


def test_it_takes_an_async_client(settings: Settings) -> None:
    async def scenario() -> list[Any]:
        client = AsyncAgentClient(settings)
        session = AgentstateSession(uid("s"), uid("u"), client=client)
        await session.add_items([{"role": "user", "content": "hi"}])
        return await session.get_items()

    assert run(scenario()) == [{"role": "user", "content": "hi"}]
