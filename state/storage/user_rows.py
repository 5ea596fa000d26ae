"""SQL for layer 3 (``user_state``), usable inside a larger transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, select, update

from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.documents.quarantine import quarantine
from state.errors import (
    CorruptStateError,
    FutureVersionError,
    MigrationError,
    UserStateTooLargeError,
)
from state.migrate import StateMigrator, stamp
from state.storage.db import dialect_insert
from state.storage.tables import user_state

logger = logging.getLogger(__name__)

_migrator = StateMigrator()


def read_row(conn: Connection, user_id: str, *, for_update: bool = False) -> tuple[str, int] | None:
    """The raw JSON text and revision of a user's row, or None."""
    query = select(user_state.c.state, user_state.c.revision).where(user_state.c.user_id == user_id)
    if for_update and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = conn.execute(query).first()
    return None if row is None else (row[0], int(row[1]))


def upgraded(doc: Document) -> Document:
    """``doc`` at the current schema version; FutureVersionError passes, bad shapes are corrupt."""
    try:
        return _migrator.migrate(doc) if _migrator.needs_migration(doc) else doc
    except FutureVersionError:
        raise
    except MigrationError as exc:
        raise CorruptStateError(str(exc)) from exc


def quarantine_row(conn: Connection, user_id: str, raw: str, reason: str) -> None:
    """Move an unreadable row aside; the user then starts from an empty state."""
    quarantine(conn, "user_state", user_id, raw, reason)
    # The row stays, emptied, with its revision still rising: a cached copy at an older
    # revision can then never come back.
    conn.execute(
        update(user_state)
        .where(user_state.c.user_id == user_id)
        .values(
            state=codec.dumps(stamp({})), revision=user_state.c.revision + 1, updated_at=utcnow()
        )
    )
    logger.error("user %s: stored state is corrupt, quarantined: %s", user_id, reason)


def upsert(conn: Connection, user_id: str, doc: Document) -> int:
    """Write ``doc`` as the user's state whatever was there; return the new revision."""
    now = utcnow()
    stmt = dialect_insert(conn, user_state).values(
        user_id=user_id, state=codec.dumps(doc), updated_at=now, revision=1
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[user_state.c.user_id],
        set_={
            "state": stmt.excluded.state,
            "updated_at": now,
            "revision": user_state.c.revision + 1,
        },
    ).returning(user_state.c.revision)
    return int(conn.execute(stmt).scalar_one())


def guarded_write(conn: Connection, user_id: str, doc: Document, expected_revision: int) -> bool:
    """Replace the state only if it is still at ``expected_revision``; True if it was."""
    result = conn.execute(
        update(user_state)
        .where(user_state.c.user_id == user_id, user_state.c.revision == expected_revision)
        .values(state=codec.dumps(doc), updated_at=utcnow(), revision=expected_revision + 1)
    )
    return result.rowcount == 1


def require_size(doc: Document, max_bytes: int) -> None:
    """Refuse a user state larger than ``max_bytes`` (AGENTSTATE_MAX_USER_STATE_BYTES)."""
    size = codec.json_size(doc, "user state")
    if size > max_bytes:
        raise UserStateTooLargeError(
            codec.too_large("user state", size, max_bytes, "AGENTSTATE_MAX_USER_STATE_BYTES")
        )


def mutate(
    conn: Connection, user_id: str, change: Callable[[Document], Document], *, max_bytes: int
) -> tuple[Document, int]:
    """Apply ``change`` to the user's state inside ``conn``'s transaction (row locked).

    A new state larger than ``max_bytes`` raises UserStateTooLargeError and writes nothing.
    """
    row = read_row(conn, user_id, for_update=True)
    current: Document = {}
    if row is not None:
        try:
            current = upgraded(codec.decode_document(row[0]))
        except CorruptStateError as exc:
            quarantine_row(conn, user_id, row[0], str(exc))
            row = None
    new_doc = stamp(codec.require_object(change(dict(current)), "user state"))
    require_size(new_doc, max_bytes)
    if row is None:
        return new_doc, upsert(conn, user_id, new_doc)
    if not guarded_write(conn, user_id, new_doc, row[1]):
        # Cannot happen under the row lock on Postgres; SQLite serializes writers.
        return new_doc, upsert(conn, user_id, new_doc)
    return new_doc, row[1] + 1
