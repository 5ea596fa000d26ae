"""Which database a process uses, told the same way by every process that reaches it.

A relative SQLite path names another file in each folder a process starts in, and one
Postgres database has many URLs (a host name or an address, PgBouncer or direct), so URLs
cannot be compared. What can: a SQLite file's absolute path, and a Postgres cluster's
system identifier with the database's name. Workers publish theirs in Redis when they
start (per queue); a client compares its own once, and warns if they differ.
"""

from __future__ import annotations

import logging
import os

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from state.storage import keys
from state.storage.db import read_connection

logger = logging.getLogger(__name__)

_POSTGRES = text("SELECT system_identifier, current_database() FROM pg_control_system()")


def database_identity(engine: Engine) -> str | None:
    """``sqlite:/abs/path`` or ``postgres:<system identifier>/<database>``; None when it
    cannot be told (an in-memory database, a Postgres that hides pg_control_system)."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        name = url.database
        return f"sqlite:{os.path.abspath(name)}" if name and name != ":memory:" else None
    try:
        with read_connection(engine) as conn:
            system_id, database = conn.execute(_POSTGRES).one()
    except SQLAlchemyError:
        return None
    return f"postgres:{system_id}/{database}"


def publish_workers_database(redis: Redis, queue: str, identity: str | None) -> None:
    """Record, for apps sending to ``queue``, the database a worker started with."""
    if identity is not None:
        redis.set(keys.workers_database(queue), identity)


def warn_if_workers_elsewhere(redis: Redis, engine: Engine, queue: str) -> bool:
    """Warn (once per call; a client calls it once) when the workers on ``queue`` last
    started with another database than ``engine``'s: they would never see what this
    process stores. Returns whether it warned; a Redis error or an unknown identity on
    either side is no warning."""
    try:
        theirs = redis.get(keys.workers_database(queue))
    except RedisError:
        return False
    ours = database_identity(engine) if theirs is not None else None
    if ours is None or theirs is None:
        return False
    theirs_text = theirs.decode() if isinstance(theirs, bytes) else str(theirs)
    if theirs_text == ours:
        return False
    logger.warning(
        "this process uses the database %s (%s), but the workers on queue %r last started "
        "with another (%s): they will not see what it stores. Give both the same "
        "AGENTSTATE_DATABASE_URL (a relative SQLite path is relative to the folder a "
        "process starts in).",
        engine.url.render_as_string(hide_password=True),
        ours,
        queue,
        theirs_text,
    )
    return True
