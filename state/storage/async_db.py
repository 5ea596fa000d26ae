"""The database for asyncio callers: SQLAlchemy's asyncio engine on an async driver
(psycopg 3 for Postgres, aiosqlite for SQLite), running the same Core statements as the
sync stores.

:func:`bridged` runs a sync store function against ``AsyncEngine.sync_engine`` inside
SQLAlchemy's greenlet bridge (what ``AsyncConnection.run_sync`` does): each statement is
awaited on the async driver, so the event loop runs other tasks while the database
answers, no thread is used, and no SQL is written twice. A function given to it must do
database work only (no Redis, no broker): those are the caller's, with asyncio clients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from config import Settings
from config.settings import DbPooler
from state.storage.db import sqlite_transactions

T = TypeVar("T")

_SQLITE_BUSY_TIMEOUT_S = 30.0


def async_url(url: str) -> str:
    """``url`` with the async driver of its database (psycopg 3, aiosqlite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg_async").render_as_string(hide_password=False)


def create_engine_for(settings: Settings) -> AsyncEngine:
    """An asyncio engine for ``settings.database_url`` (create it in the event loop that
    uses it: its connections belong to that loop)."""
    url = async_url(settings.database_url)
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S})
        sqlite_transactions(engine.sync_engine)
        return engine
    options: dict[str, Any] = {
        "pool_size": settings.db_pool_size,
        "max_overflow": settings.db_max_overflow,
        "pool_recycle": 1800,
    }
    if settings.db_pooler == DbPooler.PGBOUNCER:
        # A pooler in transaction mode: no server-side prepared statements.
        options["connect_args"] = {"prepare_threshold": None}
    return create_async_engine(url, **options)


async def bridged(engine: AsyncEngine, work: Callable[[Engine], T]) -> T:
    """``work(sync_engine)`` with its statements awaited on the async driver."""
    return await greenlet_spawn(work, engine.sync_engine)
