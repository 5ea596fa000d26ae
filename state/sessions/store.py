"""Layer 1 storage: session rows, their append-only history and their inbox.

A session row holds the state document without its history; history items are rows of
``messages`` that a turn appends and never rewrites, so the cost of a turn does not grow
with the conversation. Every write is guarded by the row's ``revision``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from state.documents import codec
from state.documents.quarantine import quarantine
from state.errors import (
    CorruptStateError,
    FutureVersionError,
    MigrationError,
    SessionOwnershipError,
    StaleStateError,
)
from state.ids import new_id
from state.machine import RESTING_STATES as RESTING
from state.migrate import StateMigrator, stamp
from state.session import SessionState, SessionStatus, as_utc, make_message, utcnow
from state.sessions import store_postgres as pg_fastpath
from state.sessions.snapshot import (
    CommitResult,
    Document,
    InboxItem,
    SessionChange,
    Snapshot,
    TransactionOp,
)
from state.storage import keys
from state.storage.cache import CachedEntry, StateCache
from state.storage.db import autocommit_engine, read_connection
from state.storage.tables import inbox, messages, sessions

# The value types live in state.sessions.snapshot; they are re-exported here for existing importers.
__all__ = [
    "CommitResult",
    "Document",
    "InboxItem",
    "SessionChange",
    "SessionStore",
    "Snapshot",
    "TransactionOp",
    "full_document",
    "has_queued",
    "new_document",
]

logger = logging.getLogger(__name__)

_migrator = StateMigrator()


def _insert_for(conn: Connection) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert


def new_document(session_id: str, user_id: str) -> Document:
    """The state document of a brand-new session (without history)."""
    doc = SessionState.new(session_id, user_id).to_document()
    doc.pop("message_history")
    return stamp(doc)


class SessionStore:
    """Reads and guarded writes of sessions; hot reads come from the cache."""

    def __init__(self, engine: Engine, cache: StateCache) -> None:
        self.engine = engine
        self.cache = cache
        self._autocommit: Engine | None = None
        if engine.dialect.name == "postgresql":
            self._autocommit = autocommit_engine(engine)

    # -- reading ---------------------------------------------------------------

    def load(self, session_id: str, expected_revision: int | None = None) -> Snapshot | None:
        """The session, from the cache when it holds ``expected_revision``, else the DB."""
        if expected_revision is not None:
            cached = self.cached(session_id)
            if cached is not None and cached.revision == expected_revision:
                return cached
        return self.load_from_database(session_id)

    def cached(self, session_id: str) -> Snapshot | None:
        """The cached snapshot if it is readable and at the current schema version, else None."""
        entry = self.cache.get(keys.session_cache(session_id))
        return None if entry is None else self.cached_from_entry(session_id, entry)

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
            with read_connection(self.engine) as conn:
                snapshot = self._read(conn, session_id, writable=False)
        except _WriteNeeded:
            # Rare: an old or damaged document. Read it again where we may write.
            with self.engine.begin() as conn:
                snapshot = self._read(conn, session_id, writable=True)
        if snapshot is not None:
            self.publish(snapshot)
        return snapshot

    def _read(self, conn: Connection, session_id: str, *, writable: bool = True) -> Snapshot | None:
        row = conn.execute(select(sessions).where(sessions.c.session_id == session_id)).first()
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
        )
        try:
            doc = codec.decode_document(row.doc)
            needs_upgrade = "message_history" in doc or _migrator.needs_migration(doc)
            if needs_upgrade:
                if not writable:
                    raise _WriteNeeded
                snapshot = self._upgrade(conn, snapshot, doc)
                doc = snapshot.doc
            SessionState.from_document({**doc, "session_id": snapshot.session_id})
        except FutureVersionError:
            raise
        except (CorruptStateError, MigrationError) as exc:
            if not writable:
                raise _WriteNeeded from exc
            return self._quarantine(conn, snapshot, row.doc, str(exc))
        return replace(snapshot, doc=doc)

    def _upgrade(self, conn: Connection, snapshot: Snapshot, doc: Document) -> Snapshot:
        # A legacy document carries its history inline: migrate it, move the history
        # into ``messages`` and write the slimmer document back at the same revision.
        migrated = _migrator.migrate(doc)
        history = migrated.pop("message_history", [])
        _insert_messages(conn, snapshot.session_id, snapshot.message_count, history)
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
        return replace(snapshot, doc=migrated, message_count=snapshot.message_count + len(history))

    def _quarantine(self, conn: Connection, snapshot: Snapshot, raw: str, reason: str) -> Snapshot:
        # Keep the bad document for an operator and give the session a fresh one, so
        # that loading it never fails again; its history rows are untouched. A turn that
        # was under way is answered with an apology, so the history still alternates.
        quarantine(conn, "session", snapshot.session_id, raw, reason)
        doc = new_document(snapshot.session_id, snapshot.user_id)
        doc["metadata"]["quarantined"] = reason
        apologies = self._answer_started(conn, snapshot.session_id)
        change = SessionChange(
            phase="idle", status=SessionStatus.ACTIVE.value, doc=doc, new_messages=apologies
        )
        doc.update(phase=change.phase, status=change.status)
        self._guarded_update(conn, snapshot, change, snapshot.revision + 1)
        _insert_messages(conn, snapshot.session_id, snapshot.message_count, apologies)
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
                    inbox.c.session_id == session_id, inbox.c.state == "started"
                )
            )
            .scalars()
            .all()
        )
        for message_id in started:
            conn.execute(
                update(inbox).where(inbox.c.message_id == message_id).values(state="answered")
            )
        text = "Sorry, your conversation state was damaged and had to be reset. Please try again."
        return [
            make_message("assistant", text, {"reply_to": mid, "kind": "apology"}) for mid in started
        ]

    def history(self, session_id: str, *, last: int | None = None) -> list[Document]:
        """The message history in order (only the ``last`` n items if given)."""
        query = select(
            messages.c.role, messages.c.content, messages.c.timestamp, messages.c["metadata"]
        ).where(messages.c.session_id == session_id)
        if last is not None:
            query = query.order_by(messages.c.seq.desc()).limit(last)
        else:
            query = query.order_by(messages.c.seq)
        with read_connection(self.engine) as conn:
            rows = conn.execute(query).all()
        items = [
            {"role": r[0], "content": r[1], "timestamp": r[2], "metadata": codec.loads(r[3])}
            for r in rows
        ]
        return items[::-1] if last is not None else items

    def document(self, session_id: str) -> Document | None:
        """The full state document with its history, JSON-ready."""
        snapshot = self.load_from_database(session_id)
        if snapshot is None:
            return None
        return full_document(snapshot, self.history(session_id))

    # -- writing ---------------------------------------------------------------

    def create(self, session_id: str, user_id: str) -> Snapshot:
        """Create the session if it does not exist; return it either way."""
        with self.engine.begin() as conn:
            _insert_session(conn, session_id, user_id)
            snapshot = self._read(conn, session_id)
        assert snapshot is not None
        return snapshot

    def commit(
        self,
        snapshot: Snapshot,
        change: SessionChange,
        before_commit: Callable[[], bool] | None = None,
    ) -> CommitResult:
        """Write ``change`` if the session is still at ``snapshot.revision``.

        Raises StaleStateError (and writes nothing) if another writer got there first or
        ``before_commit`` reports that our lock was lost.
        """
        revision = snapshot.revision + 1
        change.doc["phase"] = change.phase
        change.doc["status"] = change.status
        if self._autocommit is not None and snapshot.stored and not change.ops:
            queued = self._commit_in_one_statement(snapshot, change, before_commit)
        else:
            queued = self._commit_in_steps(snapshot, change, before_commit)
        new = Snapshot(
            session_id=snapshot.session_id,
            user_id=snapshot.user_id or str(change.doc.get("user_id") or ""),
            phase=change.phase,
            status=change.status,
            revision=revision,
            doc=change.doc,
            message_count=snapshot.message_count + len(change.new_messages),
            last_task_id=change.task_id,
            deadline_at=change.deadline_at,
        )
        return CommitResult(new, queued)

    def _commit_in_steps(
        self, snapshot: Snapshot, change: SessionChange, before_commit: Callable[[], bool] | None
    ) -> bool:
        # The general path (SQLite, new sessions, phases with extra writes): the lock is
        # checked last, inside the transaction, right before COMMIT.
        with self.engine.begin() as conn:
            if not snapshot.stored:
                _insert_session(conn, snapshot.session_id, change.doc.get("user_id") or "")
            self._guarded_update(conn, snapshot, change, snapshot.revision + 1)
            _insert_messages(conn, snapshot.session_id, snapshot.message_count, change.new_messages)
            for message_id, state in change.inbox_state.items():
                conn.execute(
                    update(inbox).where(inbox.c.message_id == message_id).values(state=state)
                )
            for op in change.ops:
                op(conn)
            queued = change.check_inbox and has_queued(conn, snapshot.session_id)
            if before_commit is not None and not before_commit():
                raise _lock_lost(snapshot)
        return queued

    def _commit_in_one_statement(
        self, snapshot: Snapshot, change: SessionChange, before_commit: Callable[[], bool] | None
    ) -> bool:
        # Postgres fast path: the lock is checked just before the one statement; the
        # revision guard in that statement still refuses any writer that lost a race.
        if before_commit is not None and not before_commit():
            raise _lock_lost(snapshot)
        fields = {
            "phase": change.phase,
            "status": change.status,
            "doc": change.doc,
            "message_count": snapshot.message_count + len(change.new_messages),
            "task_id": change.task_id,
            "deadline_at": change.deadline_at,
        }
        params = pg_fastpath.parameters(
            snapshot.session_id, snapshot.revision, fields, change.new_messages, change.inbox_state
        )
        assert self._autocommit is not None
        shape = (len(change.new_messages), len(change.inbox_state))
        applied, queued = pg_fastpath.commit(
            self.engine, self._autocommit, params, shape, change.check_inbox
        )
        if not applied:
            raise _stale(snapshot)
        return queued

    def _guarded_update(
        self, conn: Connection, snapshot: Snapshot, change: SessionChange, revision: int
    ) -> None:
        result = conn.execute(
            update(sessions)
            .where(
                sessions.c.session_id == snapshot.session_id,
                sessions.c.revision == snapshot.revision,
            )
            .values(
                revision=revision,
                phase=change.phase,
                status=change.status,
                doc=change.doc,
                message_count=snapshot.message_count + len(change.new_messages),
                last_task_id=change.task_id,
                deadline_at=change.deadline_at,
                recoveries=0,
                updated_at=utcnow(),
            )
        )
        if result.rowcount != 1:
            raise _stale(snapshot)

    # -- the inbox -------------------------------------------------------------

    def accept_message(self, session_id: str, user_id: str, text: str) -> InboxItem:
        """Store a user message durably, creating the session for ``user_id`` if new."""
        message_id = new_id("msg")
        now = utcnow()
        with self.engine.begin() as conn:
            _insert_session(conn, session_id, user_id)
            # Taking the row lock here orders inbox sequence numbers by commit, so a
            # turn never starts a later message while an earlier one is uncommitted.
            owner, seq, phase, revision = conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id)
                .values(inbox_seq=sessions.c.inbox_seq + 1)
                .returning(
                    sessions.c.user_id, sessions.c.inbox_seq, sessions.c.phase, sessions.c.revision
                )
            ).one()
            if owner != user_id:
                raise SessionOwnershipError(
                    f"session {session_id} belongs to another user; use your own session id"
                )
            conn.execute(
                insert(inbox).values(
                    message_id=message_id,
                    session_id=session_id,
                    seq=seq,
                    text=text,
                    state="queued",
                    created_at=now,
                )
            )
        return InboxItem(
            message_id, session_id, int(seq), text, "queued", now, phase in RESTING, int(revision)
        )

    def next_queued(self, session_id: str) -> InboxItem | None:
        """The oldest message of the session that has not started its turn."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(inbox)
                .where(inbox.c.session_id == session_id, inbox.c.state == "queued")
                .order_by(inbox.c.seq)
                .limit(1)
            ).first()
        if row is None:
            return None
        return InboxItem(
            row.message_id, row.session_id, row.seq, row.text, row.state, as_utc(row.created_at)
        )

    def resting(self, session_id: str) -> tuple[str, int] | None:
        """The session's phase and how many messages wait, read together in one statement
        (read apart, a turn starting in between would look like an idle session)."""
        queued = (
            select(func.count())
            .select_from(inbox)
            .where(inbox.c.session_id == session_id, inbox.c.state == "queued")
            .scalar_subquery()
        )
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(sessions.c.phase, queued).where(sessions.c.session_id == session_id)
            ).first()
        return None if row is None else (str(row[0]), int(row[1]))

    def queued_count(self, session_id: str) -> int:
        """How many messages wait for their turn."""
        with read_connection(self.engine) as conn:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(inbox)
                    .where(inbox.c.session_id == session_id, inbox.c.state == "queued")
                ).scalar_one()
            )


class _WriteNeeded(Exception):
    """A read found a document that must be upgraded or quarantined: redo it writable."""


def _stale(snapshot: Snapshot) -> StaleStateError:
    return StaleStateError(
        f"session {snapshot.session_id} is no longer at revision {snapshot.revision}"
    )


def _lock_lost(snapshot: Snapshot) -> StaleStateError:
    return StaleStateError(f"session {snapshot.session_id}: the state lock was lost before commit")


def has_queued(conn: Connection, session_id: str) -> bool:
    """Whether a message of the session waits in the inbox (inside ``conn``)."""
    row = conn.execute(
        select(inbox.c.message_id)
        .where(inbox.c.session_id == session_id, inbox.c.state == "queued")
        .limit(1)
    ).first()
    return row is not None


def full_document(snapshot: Snapshot, history: list[Document]) -> Document:
    """The session as one JSON-ready document (the seed's fields, phase, _version)."""
    doc = dict(snapshot.doc)
    doc.update(
        session_id=snapshot.session_id,
        user_id=snapshot.user_id,
        phase=snapshot.phase,
        status=snapshot.status,
        message_history=history,
        revision=snapshot.revision,
    )
    return doc


def _insert_session(conn: Connection, session_id: str, user_id: str) -> None:
    now = utcnow()
    stmt = _insert_for(conn)(sessions).values(
        session_id=session_id,
        user_id=user_id,
        phase="idle",
        status=SessionStatus.ACTIVE.value,
        revision=0,
        doc=new_document(session_id, user_id),
        message_count=0,
        inbox_seq=0,
        recoveries=0,
        created_at=now,
        updated_at=now,
    )
    conn.execute(stmt.on_conflict_do_nothing(index_elements=[sessions.c.session_id]))


def _insert_messages(
    conn: Connection, session_id: str, first_seq: int, items: list[Document]
) -> None:
    if not items:
        return
    conn.execute(
        insert(messages),
        [
            {
                "session_id": session_id,
                "seq": first_seq + offset,
                "role": str(item.get("role", "user")),
                "content": str(item.get("content", "")),
                "timestamp": str(item.get("timestamp") or utcnow().isoformat()),
                "metadata": item.get("metadata") or {},
            }
            for offset, item in enumerate(items)
        ],
    )
