"""The asyncio client's accept on Postgres: ``PostgresInbox``'s one-round-trip accept,
sent on the asyncio engine's own psycopg 3 connection. A turn's caller waits on no
thread and on one round trip, where the portable accept through the greenlet bridge
(``state.storage.async_db``) takes a transaction of several.

As with the sync accept, anything but a message to the caller's own existing session
with room in its inbox returns None, having stored nothing: the portable accept decides
(it creates the session, refuses the caller, names the quota).
"""

from __future__ import annotations

import logging

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from state.sessions.inbox_postgres import OneTripAccept
from state.sessions.snapshot import InboxItem
from state.storage import prepared

logger = logging.getLogger(__name__)

# A statement prepared on one server connection used on another: a pooler in
# transaction mode that AGENTSTATE_DB_POOLER does not name (``state.storage.prepared``).
_POOLER_SIGNS = frozenset({"26000", "42P05"})


class AsyncOneTripAccept:
    """The one-round-trip accept on an asyncio engine (module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        statements: prepared.Statements,
        max_queued: int | None,
        max_per_user: int | None = None,
    ) -> None:
        self.engine = engine
        self.statements = statements
        self.max_queued = max_queued
        self.max_per_user = max_per_user

    async def accept(self, session_id: str, user_id: str, text: str) -> InboxItem | None:
        """The accepted message, or None (nothing stored) for the portable accept."""
        message = OneTripAccept(session_id, user_id, text, self.max_queued, self.max_per_user)
        try:
            row = await self._send(message.parts)
        except psycopg.DataError as exc:
            if not message.over_quota(exc):
                raise
            return None  # the inbox is full: nothing was stored
        except psycopg.Error as exc:
            if exc.sqlstate not in _POOLER_SIGNS or not self.statements.prepares:
                raise
            # In autocommit the failed message applied nothing; unprepared from now on.
            logger.warning(
                "prepared statements fail (%s): a pooler in transaction mode is in front "
                "of Postgres, but AGENTSTATE_DB_POOLER is not set; sending them unprepared",
                exc.sqlstate,
            )
            self.statements = prepared.UNPREPARED
            return None
        return None if row is None else message.item(row)

    async def _send(self, parts: list[prepared.Part]) -> prepared.Row | None:
        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: psycopg.AsyncConnection[prepared.Row] = raw.driver_connection  # type: ignore[assignment]
            pending: list[str] = []  # PREPAREs this server connection has not seen
            sql, values = self.statements.query_message(raw.info, parts, pending.append)
            was_autocommit = driver.autocommit
            # Autocommit: the query message is its own transaction, as the sync accept's.
            await driver.set_autocommit(True)
            try:
                # Client-side binding: a query message of several statements takes
                # parameters only so (as psycopg2 sends them).
                async with psycopg.AsyncClientCursor(driver) as cursor:
                    for statement in pending:
                        await cursor.execute(statement)
                    await cursor.execute(sql, values)
                    cursor.nextset()  # past _ACCEPT's result to _ACCEPTED's
                    return await cursor.fetchone()
            finally:
                await driver.set_autocommit(was_autocommit)
