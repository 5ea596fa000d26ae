"""Many agents on one deployment, through real workers: AGENTSTATE_AGENTS names agents
beside the default one, ``list_agents`` (and ``GET /v1/agents``) lists them with their kind,
a session's first message fixes its agent, later messages go to it, and a message naming
another agent is refused with nothing stored."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from config import Settings
from state.errors import BadInputError, NotFoundError
from state.storage.db import get_engine
from state.storage.tables import events, inbox, sessions
from tasks.client import AgentClient, AsyncAgentClient
from tests.api_support import new_keys, serving
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers

AGENTS = "shout=examples.shout_agent,second=tasks.agent"


@pytest.fixture(scope="module")
def registry_settings(pg_url: str) -> Settings:
    # The inline hop policy: each session's own agent decides which phases run without a
    # broker hop (the LangGraph tests run the default policy).
    return agent_test_settings(pg_url, agents=AGENTS, hop_policy="inline")


@pytest.fixture(scope="module")
def pool(registry_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    log_dir = tmp_path_factory.mktemp("agents")
    workers = Workers(registry_settings, log_dir, count=1).start()
    yield log_dir
    workers.stop()


@pytest.fixture
def client(registry_settings: Settings, pool: Path) -> AgentClient:
    return AgentClient(registry_settings)


def last_reply(client: AgentClient, session_id: str) -> str:
    session = client.wait_for_idle(session_id, timeout=30)
    reply: str = session["message_history"][-1]["content"]
    return reply


def stored(settings: Settings, session_id: str) -> tuple[int, int, int]:
    """(session rows, inbox rows, events) of the session."""
    engine = get_engine(settings.database_url)
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(select(func.count()).where(table.c.session_id == session_id)).scalar())
            for table in (sessions, inbox, events)
        )


def test_list_agents_names_the_default_first_then_the_configured_ones(
    client: AgentClient,
) -> None:
    assert client.list_agents() == [
        {"name": "default", "kind": "phases"},
        {"name": "shout", "kind": "phases"},
        {"name": "second", "kind": "phases"},
    ]


def test_a_sessions_first_message_fixes_its_agent(client: AgentClient) -> None:
    user, loud, plain = uid("u"), uid("s"), uid("s")
    client.send_message(loud, "hello there", user_id=user, agent="shout")
    assert last_reply(client, loud) == "HELLO THERE! (shout 1)"
    # Later messages without an agent go to the session's own; naming it again is fine.
    client.send_message(loud, "again", user_id=user)
    assert last_reply(client, loud) == "AGAIN! (shout 2)"
    client.send_message(loud, "thrice", user_id=user, agent="shout")
    assert last_reply(client, loud) == "THRICE! (shout 3)"
    # A session opened without an agent runs the default one (the test agent here).
    client.send_message(plain, "what is 12*7?", user_id=user)
    assert "84" in last_reply(client, plain)
    client.send_message(plain, "what is 2*3?", user_id=user, agent="default")
    assert "6" in last_reply(client, plain)


def test_naming_another_agent_is_refused_and_stores_nothing(
    client: AgentClient, registry_settings: Settings
) -> None:
    user, session_id = uid("u"), uid("s")
    client.send_message(session_id, "hello", user_id=user, agent="shout")
    last_reply(client, session_id)
    before = stored(registry_settings, session_id)
    for other in ("default", "second"):
        with pytest.raises(BadInputError, match="runs agent 'shout'"):
            client.send_message(session_id, "switch", user_id=user, agent=other)
    assert stored(registry_settings, session_id) == before
    # A default session refuses a named agent the same way.
    plain = uid("s")
    client.send_message(plain, "hi", user_id=user)
    last_reply(client, plain)
    before = stored(registry_settings, plain)
    with pytest.raises(BadInputError, match="runs agent 'default'"):
        client.send_message(plain, "switch", user_id=user, agent="shout")
    assert stored(registry_settings, plain) == before


def test_an_unknown_agent_is_refused_before_anything_is_stored(
    client: AgentClient, registry_settings: Settings
) -> None:
    session_id = uid("s")
    for bad in ("nobody", "", "Shout", 3):
        with pytest.raises(BadInputError, match="unknown agent"):
            client.send_message(session_id, "hi", user_id=uid("u"), agent=bad)  # type: ignore[arg-type]
    assert stored(registry_settings, session_id) == (0, 0, 0)


def test_another_users_session_stays_unknown_when_an_agent_is_named(
    client: AgentClient, registry_settings: Settings
) -> None:
    session_id = uid("s")
    client.send_message(session_id, "mine", user_id="alice-agents", agent="shout")
    last_reply(client, session_id)
    before = stored(registry_settings, session_id)
    with pytest.raises(NotFoundError):
        client.send_message(session_id, "theirs", user_id=uid("u"), agent="shout")
    assert stored(registry_settings, session_id) == before


def test_the_async_client_lists_and_picks_agents(
    registry_settings: Settings, pool: Path, client: AgentClient
) -> None:
    user, session_id = uid("u"), uid("s")

    async def run() -> list[dict[str, str]]:
        async with AsyncAgentClient(registry_settings) as aio:
            await aio.send_message(session_id, "quietly", user_id=user, agent="shout")
            with pytest.raises(BadInputError):
                await aio.send_message(session_id, "x", user_id=user, agent="default")
            return await aio.list_agents()

    listed = asyncio.run(run())
    assert [agent["name"] for agent in listed] == ["default", "shout", "second"]
    assert last_reply(client, session_id) == "QUIETLY! (shout 1)"


def test_http_lists_agents_and_takes_a_messages_agent(
    registry_settings: Settings, pool: Path, client: AgentClient
) -> None:
    # A user of this test's own: the shout count is the user's, across modules.
    alice = uid("alice")
    keys = new_keys(alice)
    with serving(registry_settings, pool, keys) as api:
        http = api.client(alice)
        listed = http.get("/v1/agents")
        assert listed.status_code == 200, listed.text
        assert listed.json()[1] == {"name": "shout", "kind": "phases"}
        assert api.client().get("/v1/agents").status_code == 401
        session_id = uid("s")
        url = f"/v1/sessions/{session_id}/messages"
        sent = http.post(url, json={"text": "over http", "user_id": alice, "agent": "shout"})
        assert sent.status_code == 202, sent.text
        assert last_reply(client, session_id) == "OVER HTTP! (shout 1)"
        refused = http.post(url, json={"text": "x", "user_id": alice, "agent": "default"})
        assert refused.status_code == 400, refused.text
        unknown = http.post(url, json={"text": "x", "user_id": alice, "agent": "nobody"})
        assert unknown.status_code == 400, unknown.text
