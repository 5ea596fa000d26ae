"""The push for asyncio callers: one Redis pub/sub connection per client and event loop,
shared by every follower and waiter of that client.

A :class:`Subscription` is a queue fed by the hub's one reader task; opening one costs a
dict entry (and a SUBSCRIBE when nobody follows that channel yet), so a server can keep
thousands of followers open on one connection. Every command on the connection is sent
by the reader task itself, between reads, so nothing else ever touches it. As with the
sync :class:`state.events.push.Waiter`, a push only says "look again" (or carries a
chunk): when the connection is lost, subscriptions get None and their owners poll the
database until it is back (the reader reconnects and subscribes again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

import redis
import redis.asyncio as aioredis

from state.events.push import FALLBACK_POLL_S

logger = logging.getLogger(__name__)

_READ_S = 0.05  # the reader's longest read: how soon it sends a pending SUBSCRIBE
_CONFIRM_S = 2.0
Received = tuple[str, bytes] | None  # (channel, data); None: the push connection was lost


class Subscription:
    """What one follower receives on its channels, in order."""

    def __init__(self, hub: PushHub, channels: tuple[str, ...]) -> None:
        self.hub = hub
        self.channels = channels
        self.queue: asyncio.Queue[Received] = asyncio.Queue()
        self.confirmed = False

    async def receive(self, timeout: float) -> list[Received]:
        """Wait up to ``timeout`` seconds for something, then take all that came ([]:
        nothing came; without a confirmed subscription, a fallback poll's sleep)."""
        if not self.confirmed:
            await asyncio.sleep(min(max(0.0, timeout), FALLBACK_POLL_S))
            self.confirmed = await self.hub.confirm(self, wait_s=0.0)
            return []
        try:
            first = await asyncio.wait_for(self.queue.get(), max(0.0, timeout))
        except TimeoutError:
            return []
        items = [first]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        if None in items:
            self.confirmed = False
        return items

    def close(self) -> None:
        """Stop receiving (the hub unsubscribes channels nobody follows any more)."""
        self.hub.drop(self)


class PushHub:
    """The shared pub/sub connection of one client in one event loop (module docstring)."""

    def __init__(self, client: aioredis.Redis, enabled: bool = True) -> None:
        self.redis = client
        self.enabled = enabled
        self._subscribers: dict[str, set[Subscription]] = defaultdict(set)
        self._confirmed: dict[str, asyncio.Event] = {}
        self._wanted: set[str] = set()  # channels the connection should be subscribed to
        self._subscribed: set[str] = set()
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        # A count of what the reader received, and when (in that count) each channel last
        # had a push or the connection was lost: whether a read started after them.
        self.clock = 0
        self._last_push: dict[str, int] = {}
        self._lost_at = 0

    def listening(self, channel: str) -> bool:
        """Whether the server has confirmed this hub's subscription to ``channel``."""
        confirmed = self._confirmed.get(channel)
        return confirmed is not None and confirmed.is_set()

    def last_news(self, channel: str) -> int:
        """The :attr:`clock` at the latest push on ``channel`` (or loss of the connection,
        which may have lost one): a read started at or after it saw what it announced."""
        return max(self._last_push.get(channel, 0), self._lost_at)

    async def subscribe(self, *channels: str) -> Subscription:
        """A subscription to ``channels``, confirmed by the server before it returns
        (unconfirmed within 2 s, or with pushes off: its owner polls)."""
        subscription = Subscription(self, channels)
        if not self.enabled:
            return subscription
        for channel in channels:
            self._subscribers[channel].add(subscription)
            self._confirmed.setdefault(channel, asyncio.Event())
            self._wanted.add(channel)
        self._start()
        subscription.confirmed = await self.confirm(subscription)
        return subscription

    async def confirm(self, subscription: Subscription, wait_s: float = _CONFIRM_S) -> bool:
        """Whether every channel of ``subscription`` is subscribed (waiting up to
        ``wait_s`` for the server to say so)."""
        if not self.enabled:
            return False
        self._start()
        events = [self._confirmed.get(channel) for channel in subscription.channels]
        if any(event is None for event in events):
            return False
        if all(event.is_set() for event in events if event is not None):
            return True
        if wait_s <= 0:
            return False
        waits = [event.wait() for event in events if event is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), wait_s)
        except TimeoutError:
            return False
        return True

    def drop(self, subscription: Subscription) -> None:
        """Forget ``subscription``; a channel nobody follows is unsubscribed."""
        for channel in subscription.channels:
            followers = self._subscribers.get(channel)
            if followers is None:
                continue
            followers.discard(subscription)
            if not followers:
                del self._subscribers[channel]
                self._wanted.discard(channel)
                self._last_push.pop(channel, None)

    async def close(self) -> None:
        """Stop the reader and close the connection."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await self._disconnect()

    def _start(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                if self._pubsub is None:
                    self._pubsub = self.redis.pubsub()
                    self._subscribed = set()
                await self._apply()
                if not self._subscribed:
                    return  # nobody follows: started again by the next subscribe
                message = await self._pubsub.get_message(timeout=_READ_S)
                if message is not None:
                    self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as exc:
                logger.debug("push connection lost, followers poll until it is back: %s", exc)
                self._lost()
                await self._disconnect()
                await asyncio.sleep(FALLBACK_POLL_S)

    async def _apply(self) -> None:
        """Send the SUBSCRIBEs and UNSUBSCRIBEs the followers asked for since the last."""
        new = sorted(self._wanted - self._subscribed)
        gone = sorted(self._subscribed - self._wanted)
        if new:
            await self._pubsub.subscribe(*new)
            self._subscribed.update(new)
        if gone:
            await self._pubsub.unsubscribe(*gone)
            self._subscribed.difference_update(gone)
            for channel in gone:
                if channel not in self._wanted:
                    self._confirmed.pop(channel, None)

    def _dispatch(self, message: dict[str, Any]) -> None:
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        kind = message.get("type")
        if kind == "subscribe":
            confirmed = self._confirmed.get(str(channel))
            if confirmed is not None:
                confirmed.set()
            return
        if kind != "message":
            return
        data = message.get("data")
        payload = data if isinstance(data, bytes) else str(data).encode()
        self.clock += 1
        self._last_push[str(channel)] = self.clock
        for subscription in tuple(self._subscribers.get(str(channel), ())):
            subscription.queue.put_nowait((str(channel), payload))

    def _lost(self) -> None:
        self.clock += 1
        self._lost_at = self.clock
        for confirmed in self._confirmed.values():
            confirmed.clear()
        notified: set[int] = set()
        for followers in self._subscribers.values():
            for subscription in followers:
                if id(subscription) not in notified:
                    notified.add(id(subscription))
                    subscription.queue.put_nowait(None)

    async def _disconnect(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._subscribed = set()
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                await pubsub.aclose()
