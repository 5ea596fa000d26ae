"""Token chunks against real Redis and both databases, without workers: followers that
start while chunks pour in (their catch-up read racing the publisher) get each chunk
once, in order; a turn's chunks are bounded; a later turn's chunks replace an earlier
one's, and an earlier turn's late chunks are dropped."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import update

from config import Settings
from state.errors import InvalidPayloadError
from state.events.stream import TokenMerge, TokenStream
from state.sessions.snapshot import InboxState
from state.storage import keys
from state.storage.tables import inbox
from tasks.client import AgentClient
from tests.support import uid

CHUNKS = 1500


def running_message(client: AgentClient, session_id: str) -> str:
    """A session whose message's turn is running (its inbox row started)."""
    message_id = client.send_message(session_id, "stream to me", user_id=uid("u"))
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(inbox).where(inbox.c.message_id == message_id).values(state=InboxState.STARTED)
        )
    return message_id


def test_followers_racing_the_publisher_get_each_chunk_once_in_order(settings: Settings) -> None:
    client = AgentClient(settings)
    session_id = uid("s")
    message_id = running_message(client, session_id)
    stream = TokenStream(client.backend.redis, settings)
    sent = threading.Event()
    started = threading.Semaphore(0)

    def publish() -> None:
        for n in range(1, CHUNKS + 1):
            if n % 150 == 0:
                started.release()  # let a follower start here, mid-stream
            assert stream.send(session_id, message_id, "2024-01-01T00:00:00", f"<{n}>") == n
        sent.set()

    results: list[list[int]] = []

    def follow() -> None:
        got = []
        for item in client.events(session_id, follow=True, timeout=30, tokens=True):
            if item["kind"] == "token":
                assert item["data"]["text"] == f"<{item['data']['n']}>"
                got.append(item["data"]["n"])
                if item["data"]["n"] == CHUNKS:
                    break
        results.append(got)

    publisher = threading.Thread(target=publish)
    publisher.start()
    followers = []
    for _ in range(8):
        started.acquire()
        followers.append(threading.Thread(target=follow))
        followers[-1].start()
    publisher.join(60)
    for follower in followers:
        follower.join(60)
    assert sent.is_set() and len(results) == 8
    for got in results:
        assert got == list(range(1, CHUNKS + 1))


def test_a_turns_chunks_are_bounded_by_the_setting(settings: Settings) -> None:
    small = settings.model_copy(update={"max_stream_bytes": 100})
    client = AgentClient(small)
    stream = TokenStream(client.backend.redis, small)
    session_id = uid("s")
    assert stream.send(session_id, "msg-1", "t1", "x" * 60) == 1
    with pytest.raises(InvalidPayloadError, match="AGENTSTATE_MAX_STREAM_BYTES"):
        stream.send(session_id, "msg-1", "t1", "y" * 60)
    assert stream.send(session_id, "msg-1", "t1", "z" * 40) == 2  # what fits still goes
    with pytest.raises(InvalidPayloadError):
        stream.send(session_id, "msg-1", "t1", b"bytes")  # type: ignore[arg-type]
    stored = stream.stored(session_id)
    assert stored is not None and stored.chunks == ["x" * 60, "z" * 40]


def test_a_later_turn_replaces_the_chunks_and_an_earlier_turns_are_dropped(
    settings: Settings,
) -> None:
    client = AgentClient(settings)
    stream = TokenStream(client.backend.redis, settings)
    session_id = uid("s")
    assert stream.send(session_id, "msg-a", "2024-01-01T00:00:01", "a1") == 1
    assert stream.send(session_id, "msg-b", "2024-01-01T00:00:02", "b1") == 1
    assert stream.send(session_id, "msg-a", "2024-01-01T00:00:01", "a2") == 0  # a late handler
    assert stream.send(session_id, "msg-b", "2024-01-01T00:00:02", "b2") == 2
    stored = stream.stored(session_id)
    assert stored is not None and (stored.message_id, stored.chunks) == ("msg-b", ["b1", "b2"])
    stream.end(session_id, "msg-a")  # not the stored message's: nothing goes
    assert stream.stored(session_id) is not None
    stream.end(session_id, "msg-b")
    assert stream.stored(session_id) is None
    assert client.backend.redis.exists(keys.session_chunks(session_id)) == 0


def test_merge_shows_each_chunk_once_and_none_after_its_message_ended() -> None:
    merge = TokenMerge()
    shown: list[Any] = [merge.chunk("m1", n, "t") for n in (1, 2, 2, 1, 3)]
    assert [item and item["data"]["n"] for item in shown] == [1, 2, None, None, 3]
    merge.saw({"kind": "reply", "data": {"message_id": "m1", "text": "ttt"}})
    assert merge.chunk("m1", 4, "t") is None
    assert merge.chunk("m2", 1, "u") is not None  # the next message starts over
