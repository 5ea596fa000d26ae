"""The one place the HTTP service reaches agentstate: the client the routes call.

Every route calls :func:`open_client`'s object with the signatures of
``tasks.client.AsyncAgentClient`` (ARCHITECTURE part 3): every method a coroutine,
``events()`` an async iterator, each call naming ``user_id`` (the key's user, or None for
an operator) and the newer arguments (``multitask_strategy``, ``tokens``).

# TEMPORARY until AsyncAgentClient lands: ``ThreadedClient`` below runs the synchronous
# ``AgentClient`` in threads. It passes on only the arguments that AgentClient accepts
# (so a write's ``user_id``, ``multitask_strategy`` and ``tokens`` are dropped where it
# has none yet) and emulates nothing else. At merge, ``open_client`` returns
# ``AsyncAgentClient(settings)`` and ``ThreadedClient`` goes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from anyio import to_thread

from config import Settings
from state.documents.codec import Document
from state.errors import ServiceUnavailableError
from tasks.client import AgentClient

# A follower's thread looks up from the event feed this often to see whether its stream
# was closed (the feed itself blocks until an event or its timeout).
_FOLLOW_SLICE_S = 5.0
_HANDOFF = 64  # events a follower's thread may run ahead of its stream


def open_client(settings: Settings) -> ThreadedClient:
    """The client of one serve process (at merge: ``AsyncAgentClient(settings)``)."""
    return ThreadedClient(AgentClient(settings))


class ThreadedClient:
    """TEMPORARY until AsyncAgentClient lands: AsyncAgentClient's surface over the
    synchronous AgentClient, each call in a worker thread."""

    def __init__(self, sync: AgentClient) -> None:
        self.sync = sync

    async def close(self) -> None:
        """Nothing to close: the sync client's pools live as long as the process."""

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.sync, name, None)
        if method is None:
            raise ServiceUnavailableError(f"this build of agentstate has no {name}()")
        call = partial(method, *args, **_supported(method, kwargs))
        return await to_thread.run_sync(call)

    # -- sessions ----------------------------------------------------------------------

    async def send_message(
        self,
        session_id: str,
        text: str,
        user_id: str,
        idempotency_key: str | None = None,
        multitask_strategy: str = "enqueue",
    ) -> str:
        return str(
            await self._call(
                "send_message",
                session_id,
                text,
                user_id=user_id,
                idempotency_key=idempotency_key,
                multitask_strategy=multitask_strategy,
            )
        )

    async def get_session(
        self,
        session_id: str,
        user_id: str | None = None,
        history_limit: int | None = None,
        before_seq: int | None = None,
        revision: int | None = None,
    ) -> Document | None:
        doc: Document | None = await self._call(
            "get_session",
            session_id,
            user_id=user_id,
            history_limit=history_limit,
            before_seq=before_seq,
            revision=revision,
        )
        return doc

    async def list_sessions(
        self,
        user_id: str | None = None,
        phase: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Document:
        page: Document = await self._call(
            "list_sessions", user_id=user_id, phase=phase, limit=limit, cursor=cursor
        )
        return page

    async def revisions(
        self, session_id: str, user_id: str | None = None, after: int = 0, limit: int = 1000
    ) -> list[Document]:
        found: list[Document] = await self._call(
            "revisions", session_id, user_id=user_id, after=after, limit=limit
        )
        return found

    async def cancel_turn(self, session_id: str, user_id: str | None = None) -> bool:
        return bool(await self._call("cancel_turn", session_id, user_id=user_id))

    def events(
        self,
        session_id: str,
        *,
        after: int = 0,
        follow: bool = False,
        timeout: float | None = None,
        user_id: str | None = None,
        tokens: bool = False,
    ) -> AsyncIterator[Document]:
        options = {"user_id": user_id, "tokens": tokens}
        return _follow(
            self.sync, session_id, after=after, follow=follow, timeout=timeout, options=options
        )

    # -- workflows ---------------------------------------------------------------------

    async def start_workflow(self, spec: Document, user_id: str | None = None) -> str:
        return str(await self._call("start_workflow", spec, user_id=user_id))

    async def get_workflow(self, workflow_id: str, user_id: str | None = None) -> Document | None:
        doc: Document | None = await self._call("get_workflow", workflow_id, user_id=user_id)
        return doc

    async def list_workflows(
        self,
        user_id: str | None = None,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Document:
        page: Document = await self._call(
            "list_workflows",
            user_id=user_id,
            session_id=session_id,
            status=status,
            limit=limit,
            cursor=cursor,
        )
        return page

    async def cancel_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        doc: Document = await self._call("cancel_workflow", workflow_id, user_id=user_id)
        return doc

    async def retry_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        doc: Document = await self._call("retry_workflow", workflow_id, user_id=user_id)
        return doc

    # -- approvals and users -----------------------------------------------------------

    async def approvals(self, user_id: str | None = None, pending: bool = True) -> list[Document]:
        found: list[Document] = await self._call("approvals", user_id=user_id, pending=pending)
        return found

    async def decide(
        self,
        approval_id: str,
        approve: bool,
        by: str,
        note: str | None = None,
        user_id: str | None = None,
    ) -> Document:
        doc: Document = await self._call(
            "decide", approval_id, approve, by, note=note, user_id=user_id
        )
        return doc

    async def erase_user(self, user_id: str) -> Document:
        counts: Document = await self._call("erase_user", user_id)
        return counts


def _supported(method: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``method`` accepts (TEMPORARY: the shim drops the rest)."""
    accepted = inspect.signature(method).parameters
    return {name: value for name, value in kwargs.items() if name in accepted}


async def _follow(
    sync: AgentClient,
    session_id: str,
    *,
    after: int,
    follow: bool,
    timeout: float | None,
    options: dict[str, Any],
) -> AsyncIterator[Document]:
    """TEMPORARY: the sync feed, read by a thread of its own and handed over to this
    loop; closing the iterator stops the thread within a slice."""
    loop = asyncio.get_running_loop()
    handoff: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=_HANDOFF)
    stopped = threading.Event()

    def put(item: tuple[str, Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(handoff.put(item), loop)
        while not stopped.is_set():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                future.result(timeout=1.0)
                return
        future.cancel()

    def pump() -> None:
        try:
            cursor = after
            deadline = None if timeout is None else time.monotonic() + timeout
            while not stopped.is_set():
                left = _FOLLOW_SLICE_S if deadline is None else deadline - time.monotonic()
                if follow and left <= 0:
                    break
                kwargs = _supported(sync.events, options)
                feed = sync.events(
                    session_id,
                    after=cursor,
                    follow=follow,
                    timeout=min(left, _FOLLOW_SLICE_S),
                    **kwargs,
                )
                for event in feed:
                    put(("event", event))
                    cursor = event["seq"] if event.get("seq") is not None else cursor
                    if stopped.is_set():
                        break
                if not follow:
                    break
            put(("end", None))
        except BaseException as exc:
            put(("error", exc))

    threading.Thread(target=pump, name=f"follow-{session_id}", daemon=True).start()
    try:
        while True:
            kind, value = await handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stopped.set()
