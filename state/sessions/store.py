"""Layer 1 storage: session rows and their append-only history.

A session row holds the state document without its history; history items are rows of
``messages`` that a turn appends and never rewrites, so the cost of a turn does not grow
with the conversation. Every write is guarded by the row's ``revision``.

:class:`SessionStore` is the portable implementation (SQLite and Postgres);
``state.sessions.store_postgres.PostgresSessionStore`` overrides its write with one
prepared statement. :meth:`SessionStore.for_engine` picks the one for a database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from state.documents import codec
from state.documents.codec import Document
from state.documents.quarantine import quarantine
from state.errors import (
    CorruptStateError,
    FutureVersionError,
    MigrationError,
    StaleStateError,
)
from state.events import revisions
from state.events.log import reply_event
from state.machine import Phase
from state.migrate import StateMigrator
from state.paging import whole_number
from state.session import SessionState, SessionStatus, make_message
from state.sessions import inbox as inbox_rows
from state.sessions.history import read_history
from state.sessions.rows import (
    full_document,
    guarded_update,
    insert_messages,
    insert_session,
    lock_lost,
    new_document,
    stale,
)
from state.sessions.snapshot import (
    CommitResult,
    InboxState,
    SessionChange,
    Snapshot,
    Staged,
)
from state.storage import keys
from state.storage.cache import CachedEntry, StateCache
from state.storage.db import is_postgres, read_connection
from state.storage.prepared import PREPARED, Statements
from state.storage.tables import inbox, sessions

logger = logging.getLogger(__name__)

_migrator = StateMigrator()
_DAMAGED_REPLY = "Sorry, your conversation state was damaged and had to be reset. Please try again."


class SessionStore:
    """Reads and guarded writes of sessions; hot reads come from the cache."""

    def __init__(self, engine: Engine, cache: StateCache) -> None:
        self.engine = engine
        self.cache = cache

    @staticmethod
    def for_engine(
        engine: Engine, cache: StateCache, statements: Statements | None = None
    ) -> SessionStore:
        """The store implementation for ``engine``'s database (``statements``: how the
        Postgres store sends its statements, see ``Backend.statements``)."""
        if is_postgres(engine):
            from state.sessions.store_postgres import PostgresSessionStore

            return PostgresSessionStore(engine, cache, statements or PREPARED)
        return SessionStore(engine, cache)

    @property
    def verifies_carried(self) -> bool:
        """Whether a commit can check a snapshot carried in a task message against the
        row (only Postgres can: elsewhere a carried snapshot always commits stale)."""
        return False

    # -- reading ---------------------------------------------------------------

    def load(self, session_id: str, expected_revision: int | None = None) -> Snapshot | None:
        """The session, from the cache when it holds ``expected_revision``, else the DB."""
        entry = (
            None if expected_revision is None else self.cache.get(keys.session_cache(session_id))
        )
        cached = None if entry is None else self.cached_from_entry(session_id, entry)
        if cached is not None and cached.revision == expected_revision:
            return cached
        return self.load_from_database(session_id)

    def cached_from_entry(self, session_id: str, entry: CachedEntry) -> Snapshot | None:
        """A snapshot from a cache entry already read (None if it is not usable)."""
        try:
            snapshot = Snapshot.from_cache(session_id, *entry)
            if _migrator.needs_migration(snapshot.doc):
                return None
        except (KeyError, TypeError, ValueError, MigrationError):
            return None
        return snapshot

    def publish(self, snapshot: Snapshot) -> None:
        """Write a committed snapshot to the cache."""
        self.cache.put(
            keys.session_cache(snapshot.session_id), snapshot.revision, snapshot.to_cache()
        )

    def load_from_database(self, session_id: str) -> Snapshot | None:
        """Read (and migrate, writing the upgrade back) the session row."""
        try:
            snapshot = self._read_only(session_id)
        except _WriteNeeded:
            # Rare: an old or damaged document. Read it again where we may write.
            with self.engine.begin() as conn:
                snapshot = self._read(conn, session_id, writable=True)
        if snapshot is not None:
            self.publish(snapshot)
        return snapshot

    def _read_only(self, session_id: str) -> Snapshot | None:
        """The session from its row, if the row needs no write (else ``_WriteNeeded``)."""
        with read_connection(self.engine) as conn:
            return self._read(conn, session_id, writable=False)

    def load_in(self, conn: Connection, session_id: str) -> Snapshot | None:
        """The session as the caller's transaction sees it (migrated, written back there)."""
        return self._read(conn, session_id)

    def _read(self, conn: Connection, session_id: str, *, writable: bool = True) -> Snapshot | None:
        row = conn.execute(select(sessions).where(sessions.c.session_id == session_id)).first()
        return self._from_row(row, conn if writable else None)

    def _from_row(self, row: Any, writer: Connection | None) -> Snapshot | None:
        """The snapshot of session ``row`` (columns by name), migrated; an upgrade or a
        quarantine is written back through ``writer`` (None: ``_WriteNeeded`` instead)."""
        if row is None:
            return None
        snapshot = Snapshot(
            session_id=row.session_id,
            user_id=row.user_id,
            phase=row.phase,
            status=row.status,
            revision=int(row.revision),
            doc={},
            message_count=int(row.message_count),
            last_task_id=row.last_task_id,
            deadline_at=row.deadline_at,
            recoveries=int(row.recoveries),
        )
        try:
            doc = codec.decode_document(row.doc)
            needs_upgrade = "message_history" in doc or _migrator.needs_migration(doc)
            if needs_upgrade:
                if writer is None:
                    raise _WriteNeeded
                snapshot = self._upgrade(writer, snapshot, doc)
                doc = snapshot.doc
            SessionState.from_document({**doc, "session_id": snapshot.session_id})
        except FutureVersionError:
            raise
        except (CorruptStateError, MigrationError) as exc:
            if writer is None:
                raise _WriteNeeded from exc
            return self._quarantine(writer, snapshot, row.doc, str(exc))
        return replace(snapshot, doc=doc)

    def _upgrade(self, conn: Connection, snapshot: Snapshot, doc: Document) -> Snapshot:
        # A legacy document carries its history inline: migrate it, move the history
        # into ``messages`` and write the slimmer document back at the same revision.
        migrated = _migrator.migrate(doc)
        history = migrated.pop("message_history", [])
        insert_messages(conn, snapshot.session_id, snapshot.message_count, history)
        result = conn.execute(
            update(sessions)
            .where(
                sessions.c.session_id == snapshot.session_id,
                sessions.c.revision == snapshot.revision,
            )
            .values(doc=migrated, message_count=snapshot.message_count + len(history))
        )
        if result.rowcount != 1:
            raise StaleStateError(f"session {snapshot.session_id} changed while migrating")
        logger.info("session %s: state migrated to v%s", snapshot.session_id, migrated["_version"])
        upgraded = replace(
            snapshot, doc=migrated, message_count=snapshot.message_count + len(history)
        )
        # Later revisions are recorded as changes to this document: it becomes their base.
        revisions.record_whole(conn, upgraded, "migrated")
        return upgraded

    def _quarantine(self, conn: Connection, snapshot: Snapshot, raw: str, reason: str) -> Snapshot:
        # Keep the bad document for an operator and give the session a fresh one, so
        # that loading it never fails again; its history rows are untouched. A turn that
        # was under way is answered with an apology, so the history still alternates.
        quarantine(conn, "session", snapshot.session_id, raw, reason)
        doc = new_document(snapshot.session_id, snapshot.user_id)
        doc["metadata"]["quarantined"] = reason
        apologies = self._answer_started(conn, snapshot.session_id)
        change = SessionChange(
            phase=Phase.IDLE,
            status=SessionStatus.ACTIVE,
            doc=doc,
            new_messages=apologies,
            events=[reply_event(item) for item in apologies],
            trigger="quarantine",
        )
        doc.update(phase=change.phase, status=change.status)
        if not guarded_update(conn, snapshot, change):
            raise stale(snapshot)
        insert_messages(conn, snapshot.session_id, snapshot.message_count, apologies)
        revisions.record(conn, snapshot, change)
        logger.error(
            "session %s: stored state is corrupt, quarantined: %s", snapshot.session_id, reason
        )
        return replace(
            snapshot,
            doc=doc,
            phase=change.phase,
            status=change.status,
            revision=snapshot.revision + 1,
            message_count=snapshot.message_count + len(apologies),
            deadline_at=None,
        )

    def _answer_started(self, conn: Connection, session_id: str) -> list[Document]:
        started = (
            conn.execute(
                select(inbox.c.message_id).where(
                    inbox.c.session_id == session_id, inbox.c.state == InboxState.STARTED
                )
            )
            .scalars()
            .all()
        )
        inbox_rows.mark(conn, dict.fromkeys(started, InboxState.ANSWERED))
        return [
            make_message("assistant", _DAMAGED_REPLY, {"reply_to": mid, "kind": "apology"})
            for mid in started
        ]

    def history(
        self, session_id: str, *, last: int | None = None, before_seq: int | None = None
    ) -> list[Document]:
        """The message history in order, each item with its ``seq`` (only the ``last`` n
        items, and only those before ``before_seq``, if given). A page is one range read
        of the (session_id, seq) unique index, so it costs its size, not the history's; a
        fork's reads its source's rows up to the fork point (``state.sessions.history``)."""
        with read_connection(self.engine) as conn:
            return read_history(conn, session_id, last, before_seq)

    def document(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        history_limit: int | None = None,
        before_seq: int | None = None,
    ) -> Document | None:
        """The state document with its history (or a page of it, see :meth:`history`),
        JSON-ready; None if unknown, or if ``user_id`` is given and not the session's."""
        check_page_argument("history_limit", history_limit)
        check_page_argument("before_seq", before_seq)
        snapshot = self.load_from_database(session_id)
        if snapshot is None or (user_id is not None and snapshot.user_id != user_id):
            return None
        page = self.history(session_id, last=history_limit, before_seq=before_seq)
        return full_document(snapshot, page)

    # -- writing ---------------------------------------------------------------

    def create(self, session_id: str, user_id: str) -> Snapshot:
        """Create the session if it does not exist; return it either way."""
        with self.engine.begin() as conn:
            insert_session(conn, session_id, user_id)
            snapshot = self._read(conn, session_id)
        assert snapshot is not None
        return snapshot

    def commit(
        self,
        snapshot: Snapshot,
        change: SessionChange,
        before_commit: Callable[[], bool] | None = None,
        staged: Sequence[Staged] = (),
    ) -> CommitResult:
        """Write ``change`` if the session is still at ``snapshot.revision``.

        Raises StaleStateError (and writes nothing) if another writer got there first or
        ``before_commit`` reports that our lock was lost. ``staged``: commits held back
        by :meth:`stage`, written first, all or none of them with this one.
        """
        change.doc["phase"] = change.phase
        change.doc["status"] = change.status
        queued = self._write(snapshot, change, before_commit, staged)
        return CommitResult(after(snapshot, change), queued)

    def stage(self, snapshot: Snapshot, change: SessionChange) -> Staged | None:
        """Hold ``change`` back, to be written with the next commit (or :meth:`flush`) in
        the same round trip and transaction; None where the backend cannot (here: never;
        Postgres for a change its one statement can write)."""
        return None

    def flush(self, staged: Sequence[Staged], before_commit: Callable[[], bool] | None) -> None:
        """Write commits held back by :meth:`stage`, all or none (StaleStateError)."""
        if staged:
            with self.engine.begin() as conn:
                self._write_staged(conn, staged)

    def _write_staged(self, conn: Connection, staged: Sequence[Staged]) -> None:
        """Run held-back commits in ``conn``'s transaction (a store that stages says how)."""
        if staged:
            raise AssertionError(f"{type(self).__name__} stages nothing")

    def _write(
        self,
        snapshot: Snapshot,
        change: SessionChange,
        before_commit: Callable[[], bool] | None,
        staged: Sequence[Staged] = (),
    ) -> bool:
        """Apply ``change`` in one transaction; return whether messages wait in the inbox.

        The lock is checked last, inside the transaction, right before COMMIT.
        """
        with self.engine.begin() as conn:
            self._write_staged(conn, staged)
            return self._write_in(conn, snapshot, change, before_commit)

    def commit_in(self, conn: Connection, snapshot: Snapshot, change: SessionChange) -> Snapshot:
        """Write ``change`` in the caller's transaction (portable statements, on either
        database), with what the caller writes next; the session as it leaves it."""
        change.doc["phase"] = change.phase
        change.doc["status"] = change.status
        self._write_in(conn, snapshot, change, None)
        return after(snapshot, change)

    def _write_in(
        self,
        conn: Connection,
        snapshot: Snapshot,
        change: SessionChange,
        before_commit: Callable[[], bool] | None,
    ) -> bool:
        for op in change.prepare:
            op(conn)
        if not snapshot.stored:
            insert_session(conn, snapshot.session_id, change.doc.get("user_id") or "")
        if not guarded_update(conn, snapshot, change):
            raise stale(snapshot)
        insert_messages(conn, snapshot.session_id, snapshot.message_count, change.new_messages)
        inbox_rows.mark(conn, change.inbox_state)
        for op in change.ops:
            op(conn)
        queued = change.check_inbox and inbox_rows.has_queued(conn, snapshot.session_id)
        # Last: an op may have added an event (a workflow it cancelled).
        revisions.record(conn, snapshot, change)
        if before_commit is not None and not before_commit():
            raise lock_lost(snapshot)
        return queued


def after(snapshot: Snapshot, change: SessionChange) -> Snapshot:
    """The session as ``change`` leaves it (its document already holds phase and status)."""
    return Snapshot(
        session_id=snapshot.session_id,
        user_id=snapshot.user_id or str(change.doc.get("user_id") or ""),
        phase=change.phase,
        status=change.status,
        revision=snapshot.revision + 1,
        doc=change.doc,
        message_count=snapshot.message_count + len(change.new_messages),
        last_task_id=change.task_id,
        deadline_at=change.deadline_at,
    )


def check_page_argument(name: str, value: object) -> None:
    """InvalidPayloadError unless ``value`` is None or a whole number in a database
    integer's range (a paging argument)."""
    if value is not None:
        whole_number(value, name)


class _WriteNeeded(Exception):
    """A read found a document that must be upgraded or quarantined: redo it writable."""
