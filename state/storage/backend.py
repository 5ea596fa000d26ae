"""The connections one process needs, built once from Settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from redis import Redis
from sqlalchemy import Engine

from config import Settings, get_settings
from state.storage.cache import StateCache
from state.storage.db import get_engine
from state.storage.prepared import Statements, statements_for
from state.storage.redis_client import get_redis


@dataclass(frozen=True)
class Backend:
    """Database engine, Redis client and cache for one Settings, in one process."""

    settings: Settings
    engine: Engine
    redis: Redis
    cache: StateCache

    @property
    def statements(self) -> Statements:
        """How the Postgres stores send their statements (AGENTSTATE_DB_POOLER)."""
        return statements_for(self.settings.db_pooler)

    @classmethod
    def build(
        cls,
        settings: Settings | None = None,
        *,
        redis_client: Redis | None = None,
        engine: Engine | None = None,
    ) -> Backend:
        """A backend from ``settings`` (default: the environment); parts may be given."""
        settings = settings or get_settings()
        client = redis_client or get_redis(settings.redis_url)
        engine = engine or get_engine(
            settings.database_url,
            auto_migrate=settings.auto_migrate,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
        )
        return cls(settings, engine, client, StateCache(client, settings.cache_ttl))


_backends: dict[tuple[int, int], Backend] = {}


def default_backend(settings: Settings | None = None) -> Backend:
    """The shared backend of this process for ``settings`` (default: get_settings())."""
    settings = settings or get_settings()
    key = (id(settings), os.getpid())
    backend = _backends.get(key)
    if backend is None:
        backend = Backend.build(settings)
        _backends[key] = backend
    return backend


def reset_backends() -> None:
    """Forget the shared backends (tests change settings between runs)."""
    _backends.clear()
