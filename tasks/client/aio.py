"""The client for asyncio apps (FastAPI, aiohttp): ``AsyncAgentClient`` has every method of
``AgentClient``, with the same names and arguments, as coroutines; ``events()`` is an
async iterator.

Everything a turn's caller waits on is asyncio I/O, with no thread per call: the
database through SQLAlchemy's asyncio engine (psycopg 3, aiosqlite), running the sync
stores' own statements (``state.storage.async_db``); Redis through ``redis.asyncio``; a
message's kick pushed onto the Redis broker's queue as the sync client's publisher would
(on RabbitMQ, the sync dispatcher in a thread). Followers and waiters share one pub/sub
connection per client (``state.events.hub``), so an open follower costs a queue.

The run-control calls (cancel, retry, decide, fork, listing, starting a workflow, and
``send_message`` with a strategy other than ``enqueue``) run the sync client's code in a
thread: each is one guarded commit that also takes locks, writes the cache and sends
tasks through Celery, which has no asyncio API; they are the rare calls.

Created at import time, it opens nothing: each process (after a fork) and each event
loop gets its own connections on first use. ``await client.aclose()`` closes them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import redis
from sqlalchemy import Engine

from config import Settings, get_settings, redact_url
from config.brokers import broker_for
from state.documents import codec
from state.documents.codec import Document, require_object
from state.events.push import FALLBACK_POLL_S
from state.ids import validate_id
from state.machine import Phase
from state.migrate import stamp
from state.paging import whole_number
from state.sessions.snapshot import InboxItem
from state.storage import keys
from state.storage.async_db import bridged
from state.storage.redis_client import CACHE_PUT
from state.turns.double_texting import MultitaskStrategy
from tasks.agents.registry import checked_agent, list_agents
from tasks.app import app as default_app
from tasks.app import make_app
from tasks.client.agent import ENQUEUE_FAILED, AgentClient
from tasks.client.aio_automation import AsyncAutomation
from tasks.client.aio_connections import Connections
from tasks.client.aio_follow import Follower, tolerant
from tasks.client.control import checked_message
from tasks.client.reads import finished_workflow
from tasks.client.timeline import check_follow_arguments
from tasks.dispatch.dispatcher import PHASE_TASK, CeleryDispatcher
from tasks.observability import tracing

logger = logging.getLogger(__name__)
T = TypeVar("T")


class AsyncAgentClient(AsyncAutomation):
    """``AgentClient`` for asyncio apps (see the module docstring).

    Example (FastAPI)::

        agent = AsyncAgentClient()  # at import time: it connects on first use

        @app.post("/sessions/{session_id}/messages")
        async def post(session_id: str, body: Message) -> dict[str, str]:
            message_id = await agent.send_message(session_id, body.text, user_id=body.user)
            return {"message_id": message_id}

        @app.get("/sessions/{session_id}/stream")
        async def stream(session_id: str) -> StreamingResponse:
            async def lines() -> AsyncIterator[str]:
                async for item in agent.events(session_id, follow=True, tokens=True):
                    yield json.dumps(item) + "\\n"
            return StreamingResponse(lines())  # a client that leaves closes the iterator
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        celery = default_app if self.settings == get_settings() else make_app(self.settings)
        self.dispatcher = CeleryDispatcher(celery, broker_for(self.settings))
        self._broker_is_redis = self.settings.broker_url.startswith(("redis://", "rediss://"))
        self._connections: Connections | None = None
        self._sync: tuple[int, AgentClient] | None = None

    # -- connections -------------------------------------------------------------

    def _open(self) -> Connections:
        loop = asyncio.get_running_loop()
        current = self._connections
        if current is None or current.pid != os.getpid() or current.loop is not loop:
            # A new process (after a fork) or a new loop: the old connections are not ours.
            current = Connections.open(self.settings, self._broker_is_redis)
            self._connections = current
        return current

    def _sync_client(self) -> AgentClient:
        if self._sync is None or self._sync[0] != os.getpid():
            self._sync = (os.getpid(), AgentClient(self.settings))
        return self._sync[1]

    async def _in_thread(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The sync client's ``method`` in a thread (the rare run-control calls); keyword
        arguments left None are not passed."""
        given = {key: value for key, value in kwargs.items() if value is not None}
        return await asyncio.to_thread(getattr(self._sync_client(), method), *args, **given)

    async def _db(self, work: Callable[[Engine], T]) -> T:
        return await bridged(self._open().engine, work)

    async def aclose(self) -> None:
        """Close this loop's connections (a later call opens new ones)."""
        current, self._connections = self._connections, None
        if current is not None and current.pid == os.getpid():
            await current.close()

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- conversations -----------------------------------------------------------

    async def send_message(
        self,
        session_id: str,
        text: str,
        user_id: str,
        idempotency_key: str | None = None,
        multitask_strategy: str = "enqueue",
        *,
        agent: str | None = None,
    ) -> str:
        """``AgentClient.send_message``: durable once it returns, then its turn is kicked."""
        strategy = checked_message(
            self.settings, session_id, text, user_id, idempotency_key, strategy=multitask_strategy
        )
        named = checked_agent(self.settings, agent)
        if strategy != MultitaskStrategy.ENQUEUE or named is not None:
            message_id: str = await self._in_thread(
                "send_message",
                session_id,
                text,
                user_id,
                idempotency_key,
                str(strategy),
                agent=named,
            )
            return message_id
        # The trace of the turn starts here (AGENTSTATE_OTEL): the kick carries it.
        with tracing.client_span(
            "agentstate.send_message", self.settings, **{"agentstate.session_id": session_id}
        ):
            item = await self._accept(session_id, user_id, text, idempotency_key)
            try:
                if item.needs_kick:
                    await self._kick(session_id, item.session_revision)
            finally:
                await self._push(keys.session_events(session_id))
            return item.message_id

    async def list_agents(self) -> list[Document]:
        """``AgentClient.list_agents``."""
        return await asyncio.to_thread(list_agents, self.settings)

    async def _accept(
        self, session_id: str, user_id: str, text: str, idempotency_key: str | None
    ) -> InboxItem:
        """On Postgres one round trip (``state.sessions.inbox_async``) where the portable
        accept is not needed: a new session, another user's, a full inbox, a key."""
        connections = self._open()
        if connections.one_trip is not None and idempotency_key is None:
            item = await connections.one_trip.accept(session_id, user_id, text)
            if item is not None:
                return item
        inbox = connections.reads.inbox
        return await self._db(lambda _: inbox.accept(session_id, user_id, text, idempotency_key))

    async def _kick(self, session_id: str, revision: int | None) -> None:
        args: list[Any] = [session_id, revision]
        name = PHASE_TASK.format(Phase.UNDERSTANDING)
        broker = self._open().broker
        found = self.dispatcher.direct.redis_message(name, args, repr(args), tracing.headers())
        try:
            if found is None or broker is None:
                await asyncio.to_thread(self.dispatcher.phase, Phase.UNDERSTANDING, *args)
            else:
                await broker.lpush(*found)
        except Exception as exc:  # the message is durable; the recovery sweep kicks it
            logger.warning(ENQUEUE_FAILED, redact_url(str(exc)))

    async def _push(self, channel: str) -> None:
        if not self.settings.events:
            return
        try:
            await self._open().redis.publish(channel, "1")
        except (redis.RedisError, OSError) as exc:
            logger.debug("push on %s failed: %s", channel, exc)

    async def get_session(
        self,
        session_id: str,
        user_id: str | None = None,
        history_limit: int | None = None,
        before_seq: int | None = None,
        revision: int | None = None,
    ) -> Document | None:
        """``AgentClient.get_session``."""
        validate_id(session_id, "session")
        if user_id is not None:
            validate_id(user_id, "user")
        reads = self._open().reads
        return await self._db(
            lambda _: reads.session(session_id, user_id, history_limit, before_seq, revision)
        )

    async def wait_for_idle(
        self,
        session_id: str,
        timeout: float = 30.0,
        user_id: str | None = None,
        history_limit: int | None = None,
    ) -> Document:
        """``AgentClient.wait_for_idle``, woken by the shared push."""
        validate_id(session_id, "session")
        if user_id is not None:
            validate_id(user_id, "user")
        seen: Document = {"phase": "unknown"}
        reads = self._open().reads
        return await self._wait(
            lambda: self._db(lambda _: reads.rested(session_id, user_id, history_limit, seen)),
            timeout,
            lambda: f"session {session_id} still in {seen['phase']!r}",
            keys.session_events(session_id),
        )

    async def _wait(
        self,
        check: Callable[[], Awaitable[Document | None]],
        timeout: float,
        describe: Callable[[], str],
        channel: str,
    ) -> Document:
        deadline = time.monotonic() + timeout
        found = await tolerant(check)
        if found is not None:
            return found
        subscription = await self._open().hub.subscribe(channel)
        try:
            while True:
                found = await tolerant(check)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{describe()} after {timeout:g}s")
                await subscription.receive(min(remaining, FALLBACK_POLL_S))
        finally:
            subscription.close()

    # -- events ------------------------------------------------------------------

    def events(
        self,
        session_id: str,
        after: int = 0,
        follow: bool = False,
        timeout: float | None = None,
        user_id: str | None = None,
        *,
        tokens: bool = False,
    ) -> AsyncIterator[Document]:
        """``AgentClient.events`` as an async iterator (``async for event in ...``); an
        unknown session raises NotFoundError when iteration starts. Closing it (a
        request whose client went away) drops its subscription at once."""
        validate_id(session_id, "session")
        whole_number(after, "after")
        if user_id is not None:
            validate_id(user_id, "user")
        check_follow_arguments(timeout, tokens)
        return self._events(session_id, after, follow, timeout, user_id, tokens=tokens)

    async def _events(
        self,
        session_id: str,
        after: int,
        follow: bool,
        timeout: float | None,
        user_id: str | None,
        *,
        tokens: bool,
    ) -> AsyncIterator[Document]:
        feed = self._open().reads.feed
        generation = await self._db(lambda _: feed.generation(session_id, user_id))
        deadline = None if timeout is None else time.monotonic() + timeout
        if not follow:
            for event in await self._db(
                lambda _: list(feed.events(session_id, after, False, None))
            ):
                yield event
            return
        channels = [keys.session_events(session_id)]
        if tokens:
            channels.append(keys.session_tokens(session_id))
        subscription = await self._open().hub.subscribe(*channels)
        try:
            async for item in Follower(self._open(), session_id, generation, after, tokens).run(
                subscription, deadline
            ):
                yield item
        finally:
            subscription.close()

    # -- workflows ---------------------------------------------------------------

    async def start_workflow(self, spec: Document, user_id: str | None = None) -> str:
        """``AgentClient.start_workflow`` (in a thread: see the module docstring)."""
        workflow_id: str = await self._in_thread("start_workflow", spec, user_id=user_id)
        return workflow_id

    async def get_workflow(self, workflow_id: str, user_id: str | None = None) -> Document | None:
        """``AgentClient.get_workflow``."""
        validate_id(workflow_id, "workflow")
        if user_id is not None:
            validate_id(user_id, "user")
        workflows = self._open().workflows
        return await self._db(lambda _: workflows.document(workflow_id, user_id))

    async def wait_for_workflow(
        self, workflow_id: str, timeout: float = 60.0, user_id: str | None = None
    ) -> Document:
        """``AgentClient.wait_for_workflow``, woken by the shared push."""
        validate_id(workflow_id, "workflow")
        if user_id is not None:
            validate_id(user_id, "user")
        seen: Document = {"progress": "progress unknown"}
        workflows = self._open().workflows
        return await self._wait(
            lambda: self._db(lambda _: finished_workflow(workflows, workflow_id, user_id, seen)),
            timeout,
            lambda: f"workflow {workflow_id} unfinished ({seen['progress']})",
            keys.workflow_events(workflow_id),
        )

    # -- persistent user state ---------------------------------------------------

    async def save_user_state(self, user_id: str, state: Document) -> None:
        """``AgentClient.save_user_state``; the workers' cached copy is replaced too."""
        doc = stamp(dict(require_object(state, "user state")))
        connections = self._open()
        revision = await self._db(lambda _: connections.users.save_user_state(user_id, doc))
        key, ttl_s = keys.user_state_cache(user_id), self.settings.cache_ttl
        try:
            await connections.redis.eval(CACHE_PUT, 1, key, revision, codec.dumps(doc), ttl_s)
        except (redis.RedisError, OSError) as exc:
            # Never leave an older copy for the workers to trust: drop it.
            logger.warning("cache write of user %s failed: %s", user_id, exc)
            await connections.redis.delete(key)

    async def load_user_state(self, user_id: str) -> Document:
        """``AgentClient.load_user_state`` (read from the database)."""
        users = self._open().users
        return await self._db(lambda _: users.load_user_state(user_id))

    # -- run control, approvals, time travel (in a thread: see the module docstring) -

    async def cancel_turn(
        self, session_id: str, user_id: str | None = None, rollback: bool = False
    ) -> bool:
        """``AgentClient.cancel_turn``."""
        return bool(
            await self._in_thread("cancel_turn", session_id, user_id=user_id, rollback=rollback)
        )

    async def append_messages(
        self, session_id: str, messages: list[Document], user_id: str | None = None
    ) -> int:
        """``AgentClient.append_messages``."""
        revision: int = await self._in_thread(
            "append_messages", session_id, messages, user_id=user_id
        )
        return revision

    async def cancel_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        """``AgentClient.cancel_workflow``."""
        found: Document = await self._in_thread("cancel_workflow", workflow_id, user_id=user_id)
        return found

    async def retry_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        """``AgentClient.retry_workflow``."""
        found: Document = await self._in_thread("retry_workflow", workflow_id, user_id=user_id)
        return found

    async def create_session(self, user_id: str) -> str:
        """``AgentClient.create_session``."""
        session_id: str = await self._in_thread("create_session", user_id)
        return session_id

    async def list_sessions(
        self,
        user_id: str | None = None,
        phase: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Document:
        """``AgentClient.list_sessions``."""
        found: Document = await self._in_thread(
            "list_sessions", user_id=user_id, phase=phase, limit=limit, cursor=cursor
        )
        return found

    async def list_workflows(
        self,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        user_id: str | None = None,
    ) -> Document:
        """``AgentClient.list_workflows``."""
        found: Document = await self._in_thread(
            "list_workflows",
            session_id=session_id,
            status=status,
            limit=limit,
            cursor=cursor,
            user_id=user_id,
        )
        return found

    async def approvals(self, user_id: str | None = None, pending: bool = True) -> list[Document]:
        """``AgentClient.approvals``."""
        found: list[Document] = await self._in_thread("approvals", user_id, pending)
        return found

    async def decide(
        self,
        approval_id: str,
        approve: bool,
        by: str,
        note: str | None = None,
        user_id: str | None = None,
    ) -> Document:
        """``AgentClient.decide``."""
        found: Document = await self._in_thread(
            "decide", approval_id, approve, by, note=note, user_id=user_id
        )
        return found

    async def revisions(
        self, session_id: str, user_id: str | None = None, after: int = 0, limit: int = 1000
    ) -> list[Document]:
        """``AgentClient.revisions`` (``after`` and ``limit`` are passed on when not the
        defaults)."""
        found: list[Document] = await self._in_thread(
            "revisions",
            session_id,
            user_id=user_id,
            after=after or None,
            limit=None if limit == 1000 else limit,
        )
        return found

    async def erase_user(self, user_id: str) -> Document:
        """``AgentClient.erase_user``: the user's sessions, workflows, approvals, state
        and Redis keys, deleted."""
        found: Document = await self._in_thread("erase_user", user_id)
        return found

    async def fork_session(
        self, session_id: str, revision: int, new_session_id: str, user_id: str | None = None
    ) -> str:
        """``AgentClient.fork_session``."""
        found: str = await self._in_thread(
            "fork_session", session_id, revision, new_session_id, user_id=user_id
        )
        return found
