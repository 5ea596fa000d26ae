"""The hot path's driver cursor (``state.storage.dbapi``) keeps what SQLAlchemy's
``Connection`` gave: autocommit, its exception types, and a fresh connection after one
died (Postgres terminating the backend, as a restart or a failover does)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

from state.storage import prepared
from state.storage.db import autocommit_engine, get_engine
from state.storage.dbapi import pooled_cursor
from tests.support import uid

_BACKEND_PID = prepared.prepare("test_backend_pid", "SELECT pg_backend_pid()")
_INSERT = prepared.prepare(
    "test_insert_marker", "INSERT INTO driver_cursor_marks (mark) VALUES (%(mark)s)"
)
_COUNT = prepared.prepare(
    "test_count_marker", "SELECT count(*) FROM driver_cursor_marks WHERE mark = %(mark)s"
)
_SECRET = "a user's text that must not reach the logs"


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    plain = get_engine(pg_url)
    with plain.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS driver_cursor_marks (mark text PRIMARY KEY)"))
    yield autocommit_engine(plain)
    with plain.begin() as conn:  # the schema test compares the database with the models
        conn.execute(text("DROP TABLE driver_cursor_marks"))


@pytest.mark.parametrize("statements", [prepared.PREPARED, prepared.UNPREPARED])
def test_each_statement_commits_on_its_own(
    engine: Engine, pg_url: str, statements: prepared.Statements
) -> None:
    mark = uid("mark")
    assert statements.rows(engine, [(_INSERT, {"mark": mark})]) == []
    # Seen from another connection at once: nothing waits for a commit.
    with get_engine(pg_url).connect() as other:
        found = other.execute(
            text("SELECT count(*) FROM driver_cursor_marks WHERE mark = :m"), {"m": mark}
        ).scalar_one()
    assert found == 1
    assert statements.rows(engine, [(_COUNT, {"mark": mark})]) == [(1,)]


@pytest.mark.parametrize("statements", [prepared.PREPARED, prepared.UNPREPARED])
def test_a_driver_error_comes_out_as_sqlalchemys_without_the_values(
    engine: Engine, statements: prepared.Statements
) -> None:
    mark = uid("mark")
    statements.rows(engine, [(_INSERT, {"mark": mark})])
    with pytest.raises(IntegrityError) as raised:
        statements.rows(engine, [(_INSERT, {"mark": mark}), (_INSERT, {"mark": _SECRET})])
    assert raised.value.orig.pgcode == "23505"  # type: ignore[union-attr]
    assert _SECRET not in str(raised.value)
    # One query message is one transaction: the second insert was undone with the first.
    assert statements.rows(engine, [(_COUNT, {"mark": _SECRET})]) == [(0,)]


def test_a_statement_error_leaves_the_connection_usable(engine: Engine) -> None:
    broken = prepared.prepare("test_broken", "SELECT * FROM no_such_table_here")
    with pytest.raises(ProgrammingError):
        prepared.PREPARED.rows(engine, [(broken, {})])
    assert prepared.PREPARED.rows(engine, [(_COUNT, {"mark": uid("mark")})]) == [(0,)]


def test_a_connection_postgres_terminated_is_replaced(engine: Engine, pg_url: str) -> None:
    engine.pool.dispose()
    (pid,) = prepared.PREPARED.rows(engine, [(_BACKEND_PID, {})])[0]
    with get_engine(pg_url).connect() as other:
        other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    # The pooled connection is dead: the statement on it fails as SQLAlchemy's
    # OperationalError (a transient error to the tasks), flagged as invalidated...
    with pytest.raises(OperationalError) as raised:
        prepared.PREPARED.rows(engine, [(_BACKEND_PID, {})])
    assert isinstance(raised.value, DBAPIError) and raised.value.connection_invalidated
    # ...and the next one gets a new connection (where nothing is prepared yet).
    (fresh,) = prepared.PREPARED.rows(engine, [(_BACKEND_PID, {})])[0]
    assert fresh != pid


def test_the_cursor_is_in_autocommit_and_goes_back_to_the_pool(engine: Engine) -> None:
    engine.pool.dispose()
    with pooled_cursor(engine) as (cursor, info):
        assert cursor.connection.autocommit
        info["seen"] = True
    assert engine.pool.checkedout() == 0
    with pooled_cursor(engine) as (_cursor, info):
        assert info.get("seen")  # the same pooled connection, its info kept
