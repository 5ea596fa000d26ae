"""How ``AsyncAgentClient`` follows a session: the log read at each push, chunks woven in,
as the sync ``EventFeed`` does (``state.events.stream`` says how)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import redis
from sqlalchemy.exc import InterfaceError, OperationalError

from config import redact_url
from state.documents.codec import Document
from state.events.feed import KNOWN_MESSAGES
from state.events.hub import Subscription
from state.events.log import Page
from state.events.push import FALLBACK_POLL_S
from state.events.stream import TokenMerge, parse_published, stored_from
from state.storage import keys
from state.storage.async_db import bridged
from state.storage.redis_client import STREAM_READ
from tasks.client.aio_connections import Connections

logger = logging.getLogger(__name__)


async def tolerant(check: Callable[[], Awaitable[Document | None]]) -> Document | None:
    """While waiting, a database outage is a reason to look again later, not to give up."""
    try:
        return await check()
    except (OperationalError, InterfaceError) as exc:
        logger.warning(
            "database unreachable while waiting; retrying: %s", redact_url(str(exc.orig))
        )
        return None


class Follower:
    """One ``events(follow=True)`` iteration: the log read at each push (and on the
    fallback poll), chunks woven in as ``state.events.stream.TokenMerge`` says, as the
    sync ``EventFeed`` does."""

    def __init__(
        self,
        connections: Connections,
        session_id: str,
        generation: int,
        after: int,
        tokens: bool,
    ) -> None:
        self.connections = connections
        self.session_id = session_id
        # Bound to the session's generation: when it is gone (erased, pruned) following
        # ends, whoever takes the id next (``state.storage.generations``).
        self.generation = generation
        self.gone = False
        self.cursor = after
        self.tokens = tokens
        self.tokens_channel = keys.session_tokens(session_id)
        self.events_channel = keys.session_events(session_id)
        self.merge = TokenMerge()
        self.known: dict[str, bool] = {}
        self.backlog: list[tuple[str, bytes] | None] = []

    async def run(
        self, subscription: Subscription, deadline: float | None
    ) -> AsyncIterator[Document]:
        """The events and chunks, until ``deadline`` or until the session's generation is
        gone (then :attr:`gone` is true)."""
        if self.tokens and subscription.confirmed:
            await self._catch_up()
        read, first = True, True
        while True:
            if read:
                async for item in self._woven(subscription, shared=not first):
                    yield item
                if self.gone:
                    return
                for item in self.merge.release():
                    yield item
                first = False
            remaining = FALLBACK_POLL_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return
            self.backlog = await subscription.receive(min(remaining, FALLBACK_POLL_S))
            read = not self.backlog  # nothing came: the fallback poll reads
            async for received in self._received(subscription):
                if received is None:
                    read = True
                else:
                    yield received
            if self.gone:
                return

    async def _received(self, subscription: Subscription) -> AsyncIterator[Document | None]:
        """What the backlog brings, in order (None: a fallback read is due); stops when the
        generation is gone: the chunks after that push are not of this generation."""
        while self.backlog and not self.gone:
            entry = self.backlog.pop(0)
            if entry is None:
                yield None
            elif entry[0] != self.tokens_channel:
                async for item in self._woven(subscription):
                    yield item
            else:
                parsed = parse_published(entry[1])
                if parsed is None or not await self._ours(parsed[0]):
                    continue
                chunk = self.merge.chunk(*parsed)
                if chunk is not None:
                    yield chunk

    async def _ours(self, message_id: str) -> bool:
        """Whether the chunk's message is of this generation (``EventFeed.belongs``),
        asked once per message: a turn of an erased generation that is still streaming,
        or the next owner's, never reaches this follower."""
        if message_id not in self.known:
            if len(self.known) > KNOWN_MESSAGES:
                self.known.clear()
            feed, session_id, generation = (
                self.connections.reads.feed,
                self.session_id,
                self.generation,
            )
            self.known[message_id] = await bridged(
                self.connections.engine, lambda _: feed.belongs(session_id, message_id, generation)
            )
        return self.known[message_id]

    async def _catch_up(self) -> None:
        connections = self.connections
        session_id, feed = self.session_id, connections.reads.feed
        try:
            found = await connections.redis.eval(
                STREAM_READ, 2, keys.session_stream(session_id), keys.session_chunks(session_id)
            )
        except (redis.RedisError, OSError) as exc:
            logger.debug("stored chunks of %s unreadable: %s", session_id, exc)
            return
        stored = stored_from(found)
        if stored is not None and await bridged(
            connections.engine,
            lambda _: feed.running(session_id, stored.message_id, self.generation),
        ):
            self.merge.catch_up(stored)

    async def _woven(
        self, subscription: Subscription, *, shared: bool = True
    ) -> AsyncIterator[Document]:
        """The new events, each message's chunks before the event that ends it. Read with
        the other followers at this place (``SharedReads``), except a follower's first
        read: its subscription may be newer than a read already running. Read and handed
        on a page at a time (``EventFeed.new_events``), so a follower holds one page of
        the log, never the log; sets :attr:`gone` when the generation is."""
        while True:
            found = await self._page(shared)
            if found is None:
                self.gone = True
                return
            for event in found:
                self.cursor = event["seq"]
                ended = self.merge.ending(event)
                if ended is not None:
                    for item in [*self.merge.release(ended), *self._chunks_of(ended, subscription)]:
                        yield item
                self.merge.saw(event)
                yield event
            if not found.more:
                return

    async def _page(self, shared: bool) -> Page | None:
        connections = self.connections
        feed, session_id, after = connections.reads.feed, self.session_id, self.cursor
        generation = self.generation
        read = partial(
            bridged, connections.engine, lambda _: feed.new_events(session_id, after, generation)
        )
        if not shared:
            return await read()
        hub = connections.hub
        news = hub.last_news(self.events_channel)
        place = (f"{session_id}@{generation}", after)
        return await connections.shared.new_events(place, news, hub.clock, read)

    def _chunks_of(self, message_id: str, subscription: Subscription) -> list[Document]:
        """The chunks of ``message_id`` received and not shown yet, pulled ahead."""
        while not subscription.queue.empty():
            self.backlog.append(subscription.queue.get_nowait())
        out, rest = [], []
        for entry in self.backlog:
            parsed = None
            if entry is not None and entry[0] == self.tokens_channel:
                parsed = parse_published(entry[1])
            if parsed is not None and parsed[0] == message_id:
                chunk = self.merge.chunk(*parsed)
                if chunk is not None:
                    out.append(chunk)
            else:
                rest.append(entry)
        self.backlog = rest
        return out
