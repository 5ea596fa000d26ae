"""Reads of new events shared by ``AsyncAgentClient``'s followers of one session."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from state.events.log import Page


class SharedReads:
    """One read of a session's new events for all of this loop's followers at the same
    place that one push woke: a thousand streams of a session cost a query per push,
    not a thousand. A follower joins a read only if it started at or after the latest
    push on the session's events channel (``PushHub.last_news``), so the read holds
    what that push announced; a later push starts a read of its own. Events are shared
    between followers, read-only."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, int], tuple[int, asyncio.Task[Page | None]]] = {}

    async def new_events(
        self,
        key: tuple[str, int],
        news: int,
        now: int,
        read: Callable[[], Awaitable[Page | None]],
    ) -> Page | None:
        """The events after ``key`` (session, seq): from a running read started at or
        after ``news``, else from a read started now (at clock ``now``)."""
        running = self._running.get(key)
        if running is None or running[0] < news:
            task = asyncio.ensure_future(read())
            running = (now, task)
            self._running[key] = running
            task.add_done_callback(partial(self._finished, key))
        # Shielded: a follower that goes away does not cancel the others' read.
        return await asyncio.shield(running[1])

    def _finished(self, key: tuple[str, int], task: asyncio.Task[Page | None]) -> None:
        if self._running.get(key, (0, None))[1] is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # raised to every follower awaiting it; retrieved here too
