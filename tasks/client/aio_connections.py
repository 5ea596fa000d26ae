"""What ``AsyncAgentClient`` opens in each process and event loop: the asyncio database
engine, Redis clients, the push hub, and the sync stores it runs through the bridge."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace

import redis
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine

from config import Settings
from state.documents.codec import Document
from state.events.feed import EventFeed
from state.events.hub import PushHub
from state.sessions.inbox import Inbox
from state.sessions.inbox_async import AsyncOneTripAccept
from state.sessions.store import SessionStore
from state.storage.async_db import create_engine_for
from state.storage.cache import StateCache
from state.storage.prepared import statements_for
from state.storage.redis_client import async_redis
from state.store import PersistentStateManager
from state.workflows.reads import WorkflowReads
from tasks.client.aio_shared_reads import SharedReads
from tasks.client.reads import SessionReads


class NoCache(StateCache):
    """The sync stores' cache, switched off: the async client reads the database (the
    authority) and writes the cache itself, with its asyncio Redis client."""

    def __init__(self, ttl_s: int) -> None:
        super().__init__(redis.Redis(), ttl_s)  # never connects: nothing is called on it

    def get(self, key: str) -> None:
        return None

    def put(self, key: str, revision: int, document: Document) -> bool:
        return False

    def evict(self, key: str) -> None:
        return None


@dataclass
class Connections:
    """What one process's event loop uses (its connections belong to that loop)."""

    pid: int
    loop: asyncio.AbstractEventLoop
    engine: AsyncEngine
    redis: aioredis.Redis
    broker: aioredis.Redis | None
    hub: PushHub
    reads: SessionReads
    workflows: WorkflowReads
    users: PersistentStateManager
    shared: SharedReads
    one_trip: AsyncOneTripAccept | None  # Postgres: a message accepted in one round trip

    @classmethod
    def open(cls, settings: Settings, broker_is_redis: bool) -> Connections:
        engine = create_engine_for(settings)
        sync_engine = engine.sync_engine
        cache = NoCache(settings.cache_ttl)
        sessions = SessionStore(sync_engine, cache)
        inbox = Inbox(
            sync_engine, settings.max_queued_messages, settings.max_queued_messages_per_user
        )
        client = async_redis(settings.redis_url)
        feed = EventFeed(sync_engine, cache.redis, settings.events)
        users = PersistentStateManager(cache.redis, sync_engine, settings=settings)
        users.backend = replace(users.backend, cache=cache)
        return cls(
            pid=os.getpid(),
            loop=asyncio.get_running_loop(),
            engine=engine,
            redis=client,
            broker=async_redis(settings.broker_url) if broker_is_redis else None,
            hub=PushHub(client, settings.events),
            reads=SessionReads(sessions, inbox, feed),
            workflows=WorkflowReads(sync_engine),
            users=users,
            shared=SharedReads(),
            one_trip=None
            if sync_engine.dialect.name == "sqlite"
            else AsyncOneTripAccept(
                engine,
                statements_for(settings.db_pooler),
                settings.max_queued_messages,
                settings.max_queued_messages_per_user,
            ),
        )

    async def close(self) -> None:
        await self.hub.close()
        for client in (self.redis, self.broker):
            if client is not None:
                await client.aclose()
        await self.engine.dispose()
