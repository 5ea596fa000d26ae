"""Layer 3: persistent state that outlives sessions (preferences, long-term memory).

Postgres (or SQLite) is the authority; Redis holds a hot copy with a TTL. Every load
migrates the document to the current schema version and writes the upgrade back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from sqlalchemy import Connection, Engine

from config import Settings
from state.documents.codec import Document, decode_document, require_object
from state.errors import CorruptStateError, FutureVersionError, MigrationError
from state.ids import validate_id
from state.migrate import StateMigrator, stamp
from state.storage import keys
from state.storage import user_rows as users
from state.storage.backend import Backend
from state.storage.db import get_engine

logger = logging.getLogger(__name__)


class PersistentStateManager:
    """Saves and loads a user's persistent state (the seed's class, made safe)."""

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        postgres_client: Engine | str | None = None,
        *,
        settings: Settings | None = None,
    ) -> None:
        engine = (
            get_engine(postgres_client) if isinstance(postgres_client, str) else postgres_client
        )
        self.backend = Backend.build(settings, redis_client=redis_client, engine=engine)
        self.redis = self.backend.redis
        self.postgres = self.backend.engine
        self.migrator = StateMigrator()

    def save_user_state(self, user_id: str, state: Document) -> int:
        """Replace the user's state; return its new revision. A state larger than
        AGENTSTATE_MAX_USER_STATE_BYTES is refused (UserStateTooLargeError), nothing written."""
        validate_id(user_id, "user")
        doc = stamp(dict(require_object(state, "user state")))
        users.require_size(doc, self.backend.settings.max_user_state_bytes)
        with self.postgres.begin() as conn:
            revision = users.upsert(conn, user_id, doc)
        self.backend.cache.put(keys.user_state_cache(user_id), revision, doc)
        return revision

    def load_user_state(self, user_id: str) -> Document:
        """The user's state, migrated to the current schema version ({} if none is stored)."""
        validate_id(user_id, "user")
        cached = self.backend.cache.get(keys.user_state_cache(user_id))
        if cached is not None and not self._needs_upgrade(cached[1]):
            return cached[1]
        return self._load_from_database(user_id)

    def reload_user_state(self, user_id: str) -> Document:
        """Load from the database (migrating and writing back), bypassing the cache."""
        validate_id(user_id, "user")
        return self._load_from_database(user_id)

    def update_user_state(self, user_id: str, change: Callable[[Document], Document]) -> Document:
        """Read-modify-write the user's state in one transaction (no lost updates)."""
        validate_id(user_id, "user")
        with self.postgres.begin() as conn:
            doc, revision = users.mutate(
                conn, user_id, change, max_bytes=self.backend.settings.max_user_state_bytes
            )
        self.backend.cache.put(keys.user_state_cache(user_id), revision, doc)
        return doc

    def _needs_upgrade(self, doc: Document) -> bool:
        try:
            return self.migrator.needs_migration(doc)
        except FutureVersionError:
            raise
        except MigrationError:
            return True  # let the database copy decide what this document is

    def _load_from_database(self, user_id: str) -> Document:
        corrupt: CorruptStateError | None = None
        doc: Document = {}
        with self.postgres.begin() as conn:
            row = users.read_row(conn, user_id, for_update=True)
            if row is None:
                return {}
            raw, read_revision = row
            try:
                doc, revision = self._upgrade_in_place(
                    conn, user_id, decode_document(raw), read_revision
                )
                if revision == read_revision:
                    # Cached while the row is still locked: an erasure of the user waits
                    # for the lock, then deletes the key after this write, never before.
                    self.backend.cache.put(keys.user_state_cache(user_id), revision, doc)
            except CorruptStateError as exc:
                users.quarantine_row(conn, user_id, raw, str(exc))
                corrupt = exc
        if corrupt is not None:
            self.backend.cache.evict(keys.user_state_cache(user_id))
            raise CorruptStateError(
                f"user {user_id}: stored state was unreadable ({corrupt}); it was "
                "quarantined and the user starts empty"
            )
        if revision != read_revision:  # migrated and written back: cached once committed
            self.backend.cache.put(keys.user_state_cache(user_id), revision, doc)
        return doc

    def _upgrade_in_place(
        self, conn: Connection, user_id: str, doc: Document, revision: int
    ) -> tuple[Document, int]:
        migrated = users.upgraded(doc)
        if migrated is doc:
            return doc, revision
        if users.guarded_write(conn, user_id, migrated, revision):
            logger.info("user %s: state migrated to v%s", user_id, migrated["_version"])
            return migrated, revision + 1
        return migrated, revision
