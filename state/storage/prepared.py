"""The hot path's statements on Postgres, and how they are sent (a strategy per pooler).

psycopg2 never prepares, so Postgres plans every statement again; for the one-statement
commits that planning costs about as much as executing (~0.5 ms). :class:`Statements`
prepares each statement once per connection (``PREPARE``) and then only ``EXECUTE``s it.
After a few runs Postgres may keep one generic plan for it, made from the table
statistics without the values: so each statement here is written to have one good plan,
finding its rows by key (no index condition but the key's; see
``tests/integration/test_statement_plans.py``).

Behind a pooler in transaction mode (PgBouncer) a client's next statement may run on
another server connection, where that ``PREPARE`` never happened (or where another
client's did): :class:`UnpreparedStatements` sends the same SQL with its parameters each
time instead (``AGENTSTATE_DB_POOLER=pgbouncer``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import CursorResult

from config.settings import DbPooler
from state.storage.dbapi import pooled_cursor

_NAMED = re.compile(r"%\((\w+)\)s")
_INFO_KEY = "agentstate_prepared"
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Prepared:
    """A statement: its name, its SQL with ``%(name)s`` placeholders, the same SQL in
    positional form (``$1, $2, ...``) and the order its named parameters bind in."""

    name: str
    text: str
    sql: str
    params: tuple[str, ...]


# A statement and its parameters, as a query message carries it.
Part = tuple[Prepared, dict[str, Any]]


@lru_cache(maxsize=64)
def prepare(name: str, sql: str) -> Prepared:
    """Turn ``%(name)s`` placeholders into ``$1, $2, ...`` (each name one number)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    return Prepared(name, sql, _NAMED.sub(number, sql), tuple(order))


def first(rows: Sequence[Row]) -> Row | None:
    """The first of ``rows``, or None."""
    return rows[0] if rows else None


class Statements:
    """Runs statements prepared once per connection (Postgres without a pooler)."""

    def execute(
        self, conn: Connection, statement: Prepared, params: dict[str, Any]
    ) -> CursorResult[Any]:
        """Run ``statement`` on ``conn``, preparing it first if this connection has not."""
        return self.execute_all(conn, [(statement, params)])

    def execute_then(
        self, conn: Connection, first: Prepared, then: Prepared, params: dict[str, Any]
    ) -> CursorResult[Any]:
        """Run ``first`` and ``then`` in one round trip (one query message: one implicit
        transaction, a fresh snapshot per statement); the result is ``then``'s."""
        return self.execute_all(conn, [(first, params), (then, params)])

    def execute_all(self, conn: Connection, parts: Sequence[Part]) -> CursorResult[Any]:
        """Run each statement with its own parameters, in order, in one query message
        (one implicit transaction: an error in any of them undoes them all); the result
        is the last one's."""
        sql, values = self._message(conn.connection.info, parts, conn.exec_driver_sql)
        return conn.exec_driver_sql(sql, values)

    def rows(self, engine: Engine, parts: Sequence[Part]) -> list[Row]:
        """Like :meth:`execute_all`, on a driver cursor of ``engine``'s pool (the hot
        path: see ``state.storage.dbapi``); the last statement's rows.

        Args:
            engine: an autocommit engine (the statements are one implicit transaction).
            parts: each statement with its parameters, in order.

        Returns:
            The rows of the last statement (empty if it returns none).
        """
        with pooled_cursor(engine) as (cursor, info):
            sql, values = self._message(info, parts, cursor.execute)
            cursor.execute(sql, values)
            return list(cursor.fetchall()) if cursor.description is not None else []

    def _message(
        self, info: dict[Any, Any], parts: Sequence[Part], send: Callable[[str], object]
    ) -> tuple[str, Any]:
        """The one query message running ``parts`` and its values, after preparing (with
        ``send``) those this connection (``info``) has not prepared yet."""
        done: set[str] = info.setdefault(_INFO_KEY, set())
        values: list[Any] = []
        for statement, params in parts:
            if statement.name not in done:
                send(f"PREPARE {statement.name} AS {statement.sql}")
                done.add(statement.name)
            values.extend(params[key] for key in statement.params)
        sql = "; ".join(_execute(statement, len(statement.params)) for statement, _ in parts)
        return sql, tuple(values)


class UnpreparedStatements(Statements):
    """Sends each statement's SQL every time (a pooler in transaction mode: no state may
    outlive a transaction on the server connection), in one query message, one
    transaction on the server connection the pooler lends for it."""

    def _message(
        self, info: dict[Any, Any], parts: Sequence[Part], send: Callable[[str], object]
    ) -> tuple[str, Any]:
        """The statements' SQL in one message, each placeholder renamed after its
        statement's place (nothing is prepared: ``info`` and ``send`` go unused)."""
        texts: list[str] = []
        values: dict[str, Any] = {}
        for i, (statement, params) in enumerate(parts):
            texts.append(_NAMED.sub(rf"%(\1_{i})s", statement.text))
            values.update({f"{key}_{i}": params[key] for key in statement.params})
        return "; ".join(texts), values


def _execute(statement: Prepared, count: int) -> str:
    if not count:
        return f"EXECUTE {statement.name}"  # "name()" is a syntax error
    return f"EXECUTE {statement.name}({', '.join(['%s'] * count)})"


PREPARED = Statements()
UNPREPARED = UnpreparedStatements()
_BY_POOLER = {DbPooler.NONE: PREPARED, DbPooler.PGBOUNCER: UNPREPARED}


def statements_for(pooler: DbPooler) -> Statements:
    """How to send the hot path's statements with ``pooler`` in front of Postgres."""
    return _BY_POOLER[pooler]
