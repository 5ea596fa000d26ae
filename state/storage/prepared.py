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

A process whose prepared statements meet such a pooler anyway (the setting forgotten, a
pooler added later) notices: "prepared statement ... does not exist" or "... already
exists" cannot happen on a connection of its own. From then on the process sends its
statements to that database URL unprepared and says so once, naming AGENTSTATE_DB_POOLER.
The statement that failed is sent again unprepared when it ran alone in autocommit (a
failed query message applied nothing); inside a caller's transaction, which the error
ended, it raises PoolerInTransactionModeError, a ServiceUnavailableError, so the task
runs again.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, CursorResult
from sqlalchemy.exc import DBAPIError

from config.settings import DbPooler
from state.errors import PoolerInTransactionModeError
from state.storage.dbapi import pooled_cursor

logger = logging.getLogger(__name__)

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


# SQLSTATEs of a prepared statement missing (invalid_sql_statement_name) or there already
# (duplicate_prepared_statement): on a connection of our own neither can happen.
_POOLER_SIGNS = frozenset({"26000", "42P05"})
# The databases (by URL, password hidden) this process found behind such a pooler.
_behind_pooler: set[str] = set()
_seen_lock = threading.Lock()


def _pooled(url: URL) -> bool:
    # The set is empty unless a pooler was met: the hot path pays one truth test.
    return bool(_behind_pooler) and str(url) in _behind_pooler


def _met_a_pooler(exc: DBAPIError, url: URL) -> bool:
    """Whether ``exc`` shows statements prepared on one server connection being used on
    another; if so, this process sends the statements for ``url`` unprepared from now
    on, and says so once."""
    if getattr(exc.orig, "pgcode", None) not in _POOLER_SIGNS:
        return False
    with _seen_lock:
        if not _pooled(url):
            _behind_pooler.add(str(url))
            first_line = (str(exc.orig).strip().splitlines() or ["?"])[0]
            logger.warning(
                "prepared statements fail on %s (%s): a pooler in transaction mode "
                "(PgBouncer) is in front of Postgres, but AGENTSTATE_DB_POOLER is not set. "
                "This process sends its statements unprepared from now on; set "
                "AGENTSTATE_DB_POOLER=pgbouncer to start that way.",
                url,
                first_line,
            )
    return True


class Statements:
    """Runs statements prepared once per connection (Postgres without a pooler); from the
    first sign of a pooler in transaction mode, unprepared (see the module docstring)."""

    prepares = True

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
        if self.prepares and _pooled(conn.engine.url):
            return UNPREPARED.execute_all(conn, parts)
        try:
            sql, values = self.query_message(conn.connection.info, parts, conn.exec_driver_sql)
            return conn.exec_driver_sql(sql, values)
        except DBAPIError as exc:
            if not self.prepares or not _met_a_pooler(exc, conn.engine.url):
                raise
            # The error ended the caller's transaction: all of it must run again.
            raise PoolerInTransactionModeError(
                "prepared statements failed behind a pooler in transaction mode "
                "(AGENTSTATE_DB_POOLER is not set); running it again unprepared"
            ) from exc

    def rows(self, engine: Engine, parts: Sequence[Part]) -> list[Row]:
        """Like :meth:`execute_all`, on a driver cursor of ``engine``'s pool (the hot
        path: see ``state.storage.dbapi``); the last statement's rows.

        Args:
            engine: an autocommit engine (the statements are one implicit transaction).
            parts: each statement with its parameters, in order.

        Returns:
            The rows of the last statement (empty if it returns none).
        """
        if self.prepares and _pooled(engine.url):
            return UNPREPARED.rows(engine, parts)
        try:
            with pooled_cursor(engine) as (cursor, info):
                sql, values = self.query_message(info, parts, cursor.execute)
                cursor.execute(sql, values)
                return list(cursor.fetchall()) if cursor.description is not None else []
        except DBAPIError as exc:
            if not self.prepares or not _met_a_pooler(exc, engine.url):
                raise
        # In autocommit the failed message was its own transaction and applied nothing.
        return UNPREPARED.rows(engine, parts)

    def query_message(
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

    prepares = False

    def query_message(
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
