"""A follower holds one page of a session's log at a time, bounded in bytes as well as in
events (issue 39: an open stream read the whole log into memory), and reads only its own
generation of the session."""

from __future__ import annotations

from config import Settings
from state.events import log
from state.storage.db import get_engine, read_connection
from tasks.client import AgentClient
from tests.support import uid

BIG = 30_000  # characters of each message
LIMIT = 100_000  # bytes of a page here (1 MiB by default): three such events and a bit


def test_a_page_is_bounded_in_bytes_and_the_log_is_read_whole_page_by_page(
    pg_settings: Settings,
) -> None:
    client = AgentClient(pg_settings)
    session_id, user = uid("big"), uid("u")
    for n in range(9):
        client.send_message(session_id, f"{n}" * BIG, user_id=user)
    engine = get_engine(pg_settings.database_url)
    generation = client.feed.generation(session_id)
    seen: list[int] = []
    pages = 0
    after = 0
    while True:
        with read_connection(engine) as conn:
            page = log.read_generation(conn, session_id, generation, after, 500, max_bytes=LIMIT)
        assert page is not None
        pages += 1
        size = sum(len(str(event["data"])) for event in page)
        assert len(page) == 1 or size - BIG < LIMIT, size
        seen += [event["seq"] for event in page]
        if not page.more:
            break
        after = page[-1]["seq"]
    events = client.events(session_id)
    assert seen == [event["seq"] for event in events]  # all of them, once, in order
    assert pages > 2


def test_a_page_of_another_generation_reads_as_gone(pg_settings: Settings) -> None:
    client = AgentClient(pg_settings)
    session_id, alice, bob = uid("s"), uid("alice"), uid("bob")
    client.send_message(session_id, "alice's", user_id=alice)
    old = client.feed.generation(session_id)
    client.erase_user(alice)
    client.send_message(session_id, "bob's", user_id=bob)
    engine = get_engine(pg_settings.database_url)
    with read_connection(engine) as conn:
        assert log.read_generation(conn, session_id, old, 0, 500) is None
        mine = log.read_generation(conn, session_id, client.feed.generation(session_id), 0, 500)
    assert mine is not None and "bob's" in str([event["data"] for event in mine])
