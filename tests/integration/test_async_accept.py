"""The asyncio client's one-round-trip accept on Postgres (``state.sessions.inbox_async``):
to the caller's own session it stores the message and its event once; anything else (a
new session, another user's, a full inbox) stores nothing and the portable accept
decides, as for the sync client. Prepared and unprepared (a pooler) alike."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from config import Settings
from config.settings import DbPooler
from state.errors import NotFoundError, QuotaExceededError
from state.storage.db import get_engine
from state.storage.tables import events, inbox
from tasks.client import AsyncAgentClient
from tests.support import make_settings, uid


@pytest.fixture(params=[DbPooler.NONE, DbPooler.PGBOUNCER], ids=["prepared", "unprepared"])
def accept_settings(pg_url: str, request: pytest.FixtureRequest) -> Settings:
    return make_settings(pg_url, queue=uid("q"), max_queued_messages=3, db_pooler=request.param)


def counts(settings: Settings, session_id: str) -> tuple[int, int]:
    with get_engine(settings.database_url).connect() as conn:
        messages = conn.execute(
            select(func.count()).select_from(inbox).where(inbox.c.session_id == session_id)
        ).scalar_one()
        accepted = conn.execute(
            select(func.count())
            .select_from(events)
            .where(events.c.session_id == session_id, events.c.kind == "message_accepted")
        ).scalar_one()
    return int(messages), int(accepted)


def test_the_one_trip_accept_stores_once_and_leaves_the_rest_to_the_portable_one(
    accept_settings: Settings,
) -> None:
    session_id, alice, mallory = uid("s"), uid("alice"), uid("mallory")

    async def scenario() -> list[str | None]:
        async with AsyncAgentClient(accept_settings) as client:
            one_trip = client._open().one_trip
            assert one_trip is not None
            new = await one_trip.accept(session_id, alice, "first")  # no session yet
            await client.send_message(session_id, "first", user_id=alice)  # portable: creates it
            own = [await one_trip.accept(session_id, alice, f"m{i}") for i in range(2)]
            full = await one_trip.accept(session_id, alice, "too many")  # 3 wait already
            foreign = await one_trip.accept(session_id, mallory, "not yours")
            with pytest.raises(QuotaExceededError):
                await client.send_message(session_id, "too many", user_id=alice)
            with pytest.raises(NotFoundError):
                await client.send_message(session_id, "not yours", user_id=mallory)
            return [
                None if new is None else new.message_id,
                *(item.message_id if item else None for item in own),
                None if full is None else full.message_id,
                None if foreign is None else foreign.message_id,
            ]

    new, first, second, full, foreign = asyncio.run(scenario())
    assert new is None and full is None and foreign is None
    assert first and second
    assert counts(accept_settings, session_id) == (3, 3)
