"""AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER (issue 39): the quota was per session only, so a
user could open any number of sessions, each with a full inbox. Without workers every
message waits; the sync client's both accepts (a new session: the portable one; an
existing one: one round trip) and the asyncio client's are held to it."""

from __future__ import annotations

import asyncio

import pytest

from config import Settings
from state.errors import QuotaExceededError
from tasks.client import AgentClient
from tasks.client.aio import AsyncAgentClient
from tests.support import make_settings, uid

LIMIT = 3


@pytest.fixture
def limited(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"), max_queued_messages_per_user=LIMIT)


def test_a_users_waiting_messages_are_capped_across_their_sessions(limited: Settings) -> None:
    client = AgentClient(limited)
    user, other = uid("u"), uid("u")
    sessions = [uid("s") for _ in range(LIMIT)]
    for session_id in sessions:
        client.send_message(session_id, "waits", user_id=user)
    extra = uid("s")
    for target in (extra, sessions[0]):  # a new session, and one of theirs
        with pytest.raises(QuotaExceededError, match="AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER"):
            client.send_message(target, "one too many", user_id=user)
    assert client.get_session(extra) is None  # nothing stored
    assert client.inbox.queued_count(sessions[0]) == 1
    client.send_message(uid("s"), "another user's is their own", user_id=other)


def test_the_asyncio_client_is_held_to_it_too(limited: Settings) -> None:
    user = uid("u")

    async def run() -> None:
        client = AsyncAgentClient(limited)
        try:
            session_id = uid("s")
            for _ in range(LIMIT):
                await client.send_message(session_id, "waits", user_id=user)
            with pytest.raises(QuotaExceededError, match="PER_USER"):
                await client.send_message(session_id, "one too many", user_id=user)
            with pytest.raises(QuotaExceededError, match="PER_USER"):
                await client.send_message(uid("s"), "one too many", user_id=user)
        finally:
            await client.aclose()

    asyncio.run(run())
