"""Database engines (one per process and URL) and the Alembic schema upgrade."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, Table, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError

from config import redact_url
from config.urls import normalise_database_url
from state.errors import ConfigurationError, ServiceUnavailableError
from state.storage.forksafe import track_engine

logger = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).with_name("schema")
# Any constant works; it only has to be the same in every process that upgrades.
_UPGRADE_LOCK_KEY = 0x61676E74
# Postgres ends one transaction of a deadlock (40P01) or a serialization failure (40001)
# having done nothing; running it again is how Postgres means them to be handled.
_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
CONFLICT_ATTEMPTS = 5
_CONFLICT_BACKOFF_S = 0.01
T = TypeVar("T")
_SQLITE_BUSY_TIMEOUT_S = 30
_READ_ONLY = "agentstate_read_only"

# The defaults of Settings.db_pool_size and db_max_overflow.
DEFAULT_POOL_SIZE = 5
DEFAULT_MAX_OVERFLOW = 10

# Keyed by (url, isolation level, pool size, max overflow, pid).
_Key = tuple[str, str | None, int, int, int]
_engines: dict[_Key, Engine] = {}
_checked: set[_Key] = set()
_pool_sizes: weakref.WeakKeyDictionary[Engine, tuple[int, int]] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def get_engine(
    url: str,
    *,
    auto_migrate: bool = False,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
    _isolation: str | None = None,
) -> Engine:
    """The engine for ``url`` in this process (a child forked later empties its pool).

    At most ``pool_size + max_overflow`` connections (Postgres); its autocommit sibling
    may hold as many again.
    """
    url = normalise_database_url(url)
    key = (url, _isolation, pool_size, max_overflow, os.getpid())
    engine = _engines.get(key)
    if engine is None:
        with _guard:
            engine = _engines.get(key)
            if engine is None:
                engine = track_engine(_create_engine(url, _isolation, pool_size, max_overflow))
                _pool_sizes[engine] = (pool_size, max_overflow)
                _engines[key] = engine
    if auto_migrate and key not in _checked:
        ensure_schema(engine)
        _checked.add(key)
    return engine


def autocommit_engine(engine: Engine) -> Engine:
    """A sibling engine whose connections stay in autocommit mode (one-statement commits).

    A pool of its own (as large as ``engine``'s): switching a pooled connection in and
    out of autocommit costs a driver call each way, on the hottest path there is.
    """
    size, overflow = _pool_sizes.get(engine, (DEFAULT_POOL_SIZE, DEFAULT_MAX_OVERFLOW))
    return get_engine(
        engine.url.render_as_string(hide_password=False),
        pool_size=size,
        max_overflow=overflow,
        _isolation="AUTOCOMMIT",
    )


def dispose_engines() -> None:
    """Forget every engine of this process (after a fork, or in tests)."""
    with _guard:
        for engine in _engines.values():
            engine.dispose(close=False)
        _engines.clear()
        _checked.clear()


def _create_engine(
    url: str,
    isolation: str | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
) -> Engine:
    try:
        parsed = make_url(url)
    except Exception:
        # SQLAlchemy's own errors quote the URL, password included.
        raise ConfigurationError(
            "not a valid database URL (check AGENTSTATE_DATABASE_URL; percent-escape special "
            "characters in the user name and password)"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        return _create_sqlite_engine(url)
    options: dict[str, Any] = {
        "pool_size": pool_size,
        "max_overflow": max_overflow,
        "pool_recycle": 1800,
    }
    if isolation:
        options["isolation_level"] = isolation
    return create_engine(parsed, **options)


def _create_sqlite_engine(url: str) -> Engine:
    engine = create_engine(
        url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
    )
    sqlite_transactions(engine)
    return engine


def sqlite_transactions(engine: Engine) -> None:
    """Make ``engine``'s SQLite connections take the write lock up front in a writer's
    transaction (and WAL), as every agentstate SQLite engine does."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN below control transactions, not the sqlite3 module.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A writer takes the write lock up front: two deferred transactions that both
        # upgrade from read to write would deadlock, one failing "database is locked".
        # A reader (read_connection) must not take it, or polling would stall writers.
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def read_connection(engine: Engine) -> Connection:
    """A connection for reads only (on SQLite it does not take the write lock)."""
    return engine.connect().execution_options(**{_READ_ONLY: True})


def is_postgres(engine: Engine | Connection) -> bool:
    """True for the Postgres backend."""
    return engine.dialect.name == "postgresql"


def dialect_insert(conn: Connection, table: Table) -> Any:
    """An INSERT with ``ON CONFLICT`` support (Postgres and SQLite spell it alike)."""
    return (postgresql if is_postgres(conn) else sqlite).insert(table)


def alembic_config(engine: Engine) -> Any:
    """An Alembic Config that runs our migrations against ``engine``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(SCHEMA_DIR))
    # No sqlalchemy.url: Alembic's options go through configparser, which reads "%" in a
    # percent-escaped password as interpolation (and quotes the URL in its error). The
    # migrations run on the connection upgrade_schema hands env.py.
    cfg.attributes["engine"] = engine
    return cfg


def head_revision(engine: Engine) -> str:
    """The newest schema revision this code knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade_schema(engine: Engine) -> str:
    """Bring the schema to head (safe to run from many processes at once)."""
    from alembic import command

    cfg = alembic_config(engine)
    try:
        with engine.begin() as conn:
            if is_postgres(conn):
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK_KEY})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    except DBAPIError as exc:
        raise ServiceUnavailableError(
            f"schema upgrade failed on {redact_url(str(engine.url))}: {exc.orig}"
        ) from exc
    return head_revision(engine)


def ensure_schema(engine: Engine) -> None:
    """Upgrade the schema if it is behind this code (the embedded-default convenience)."""
    if current_revision(engine) != head_revision(engine):
        logger.info("upgrading database schema at %s", redact_url(str(engine.url)))
        upgrade_schema(engine)


def lost_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Postgres ending a transaction to break a deadlock or a
    serialization conflict (nothing of it was written)."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "pgcode", None) in _CONFLICT_SQLSTATES


def retried_on_conflict(transaction: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """Run ``transaction`` (a whole transaction: it begins and commits its own), again
    after a short jittered pause when Postgres ended it to break a deadlock.

    For transactions that lock many rows of a workflow in an order that a step's own
    commit may take the other way round (a cancel skipping every open step, a retry, a
    decision skipping a rejected step's dependents): whichever of the two Postgres picks
    runs again and lands. The last attempt's error is raised.
    """
    for attempt in range(attempts - 1):
        try:
            return transaction()
        except DBAPIError as exc:
            if not lost_conflict(exc):
                raise
            code = getattr(exc.orig, "pgcode", None)
            logger.info("Postgres ended a transaction (SQLSTATE %s); running it again", code)
            time.sleep(random.uniform(0, _CONFLICT_BACKOFF_S * 2**attempt))
    return transaction()
