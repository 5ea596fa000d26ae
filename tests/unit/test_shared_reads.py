"""Followers of one session share a read of its new events only when that read holds what
the push that woke them announced: one query for many streams, none of them behind."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from state.documents.codec import Document
from state.events.hub import PushHub
from tasks.client.aio_shared_reads import SharedReads

KEY = ("s-1", 0)


class CountedRead:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> list[Document]:
        self.calls += 1
        this = self.calls
        await asyncio.sleep(0.02)
        return [{"seq": this}]


def test_followers_woken_by_one_push_share_one_read() -> None:
    async def scenario() -> tuple[int, list[list[Document]]]:
        shared, read = SharedReads(), CountedRead()
        found = await asyncio.gather(*(shared.new_events(KEY, 3, 3, read) for _ in range(200)))
        return read.calls, found

    calls, found = asyncio.run(scenario())
    assert calls == 1
    assert all(events == [{"seq": 1}] for events in found)


def test_a_push_after_a_read_started_gets_a_read_of_its_own() -> None:
    async def scenario() -> tuple[int, list[Document], list[Document]]:
        shared, read = SharedReads(), CountedRead()
        early = asyncio.ensure_future(shared.new_events(KEY, 3, 3, read))
        await asyncio.sleep(0)  # the first read is running
        late = asyncio.ensure_future(shared.new_events(KEY, 4, 4, read))  # news at 4
        early_events, late_events = await early, await late
        return read.calls, early_events, late_events

    calls, early, late = asyncio.run(scenario())
    assert calls == 2
    assert early == [{"seq": 1}] and late == [{"seq": 2}]


def test_other_places_in_the_log_are_read_apart() -> None:
    async def scenario() -> int:
        shared, read = SharedReads(), CountedRead()
        await asyncio.gather(
            shared.new_events(("s-1", 0), 0, 0, read),
            shared.new_events(("s-1", 7), 0, 0, read),
            shared.new_events(("s-2", 0), 0, 0, read),
        )
        return read.calls

    assert asyncio.run(scenario()) == 3


def test_a_follower_going_away_does_not_cancel_the_others_read() -> None:
    async def scenario() -> list[Document]:
        shared, read = SharedReads(), CountedRead()
        leaving = asyncio.ensure_future(shared.new_events(KEY, 0, 0, read))
        staying = asyncio.ensure_future(shared.new_events(KEY, 0, 0, read))
        await asyncio.sleep(0.005)
        leaving.cancel()
        return await staying

    assert asyncio.run(scenario()) == [{"seq": 1}]


def test_a_failed_read_reaches_every_follower_and_is_not_kept() -> None:
    async def scenario() -> tuple[list[BaseException | list[Document]], int]:
        shared = SharedReads()

        async def failing() -> list[Document]:
            await asyncio.sleep(0.01)
            raise ConnectionError("database gone")

        results = await asyncio.gather(
            *(shared.new_events(KEY, 0, 0, failing) for _ in range(3)), return_exceptions=True
        )
        read = CountedRead()
        await shared.new_events(KEY, 0, 0, read)  # a new read, not the failed one
        return results, read.calls

    results, calls = asyncio.run(scenario())
    assert all(isinstance(r, ConnectionError) for r in results)
    assert calls == 1


def test_the_hub_dates_each_channels_latest_push_and_a_lost_connection() -> None:
    hub = PushHub(aioredis.Redis())  # never connects: messages are handed to it
    events, other = "agentstate:events:s-1", "agentstate:events:s-2"
    assert hub.last_news(events) == 0
    hub._dispatch({"type": "message", "channel": events.encode(), "data": b"1"})
    hub._dispatch({"type": "message", "channel": other.encode(), "data": b"1"})
    assert (hub.last_news(events), hub.last_news(other), hub.clock) == (1, 2, 2)
    hub._lost()
    assert hub.last_news(events) == hub.last_news(other) == hub.clock == 3
