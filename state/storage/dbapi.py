"""The hot path's way to Postgres: a driver cursor on a pooled connection.

A statement sent through SQLAlchemy's ``Connection`` pays for the ``Connection`` object,
its events, transaction bookkeeping and the result's metadata: about 130 us of CPU for a
one-row statement here, against about 30 us through a driver cursor on a connection
checked out of the same pool. The hot path (a phase's commit, a step's claim and
success, a message's accept) runs thousands of times a second, so it takes the cursor.

What SQLAlchemy's ``Connection`` would do on an error is kept: a driver error comes out
as SQLAlchemy's exception of that kind (``OperationalError``, ``IntegrityError``, ...,
with the driver's error as ``orig``), and a connection the error shows dead is
invalidated, so the pool hands out a fresh one next.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError


@contextmanager
def pooled_cursor(engine: Engine) -> Iterator[tuple[Any, dict[Any, Any]]]:
    """A driver cursor on a connection of ``engine``'s pool, and that connection's
    ``info`` dict (what lives as long as the connection, like its prepared statements).

    The connection has ``engine``'s isolation level (an autocommit engine's is in
    autocommit mode) and goes back to the pool on exit.
    """
    driver_error = engine.dialect.loaded_dbapi.Error
    pooled = engine.raw_connection()
    try:
        cursor = pooled.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            yield cursor, pooled.info
        finally:
            cursor.close()
    except driver_error as exc:
        raise _translated(engine, pooled, exc) from exc
    finally:
        pooled.close()


def _translated(engine: Engine, pooled: Any, exc: Exception) -> Exception:
    dead = engine.dialect.is_disconnect(cast(Any, exc), pooled.dbapi_connection, None)
    if dead:
        pooled.invalidate(exc)
    # The parameters are anyone's text: never in the message (it reaches the logs).
    return DBAPIError.instance(
        None,
        None,
        exc,
        engine.dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=dead,
        dialect=engine.dialect,
    )
