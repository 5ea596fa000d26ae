"""Bulk maintenance: migrate every stored document to the current schema version, in batches."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from sqlalchemy import Engine, select

from state.documents import codec
from state.errors import CorruptStateError, FutureVersionError, MigrationError
from state.migrate import StateMigrator
from state.sessions.store import SessionStore
from state.storage.db import read_connection
from state.storage.tables import sessions, user_state
from state.store import PersistentStateManager

logger = logging.getLogger(__name__)

Progress = Callable[[str, int], None]
_migrator = StateMigrator()


@dataclass
class MigrationReport:
    """Counts per outcome for one kind of document."""

    scanned: int = 0
    current: int = 0
    migrated: int = 0
    refused_newer: int = 0
    quarantined: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-ready form."""
        return asdict(self)


def needs_work(raw: str) -> bool:
    """Whether a stored document is older than the code (or carries inline history)."""
    doc = codec.loads(raw)
    if not isinstance(doc, dict):
        raise CorruptStateError("not a JSON object")
    return ("message_history" in doc and "session_id" in doc) or _migrator.needs_migration(doc)


def migrate_sessions(
    store: SessionStore, *, dry_run: bool, batch: int, progress: Progress | None = None
) -> MigrationReport:
    """Load (and so migrate and write back) every session, ``batch`` rows at a time."""
    table = (sessions.c.session_id, sessions.c.doc)
    return _migrate_all(
        store.engine,
        table,
        store.load_from_database,
        dry_run,
        batch,
        partial(progress, "sessions") if progress else None,
    )


def migrate_users(
    manager: PersistentStateManager, *, dry_run: bool, batch: int, progress: Progress | None = None
) -> MigrationReport:
    """Load (and so migrate and write back) every user's state, ``batch`` rows at a time."""
    table = (user_state.c.user_id, user_state.c.state)
    return _migrate_all(
        manager.postgres,
        table,
        manager.reload_user_state,
        dry_run,
        batch,
        partial(progress, "users") if progress else None,
    )


def _migrate_all(  # noqa: PLR0917 (private; called twice, with positions spelled out)
    engine: Engine,
    table: tuple[Any, Any],
    load: Callable[[str], Any],
    dry_run: bool,
    batch: int,
    progress: Callable[[int], None] | None,
) -> MigrationReport:
    report = MigrationReport()
    after = ""
    while page := _page(engine, *table, after, batch):
        for key, raw in page:
            _classify(report, raw, dry_run, partial(load, key))
        after = page[-1][0]
        if progress:
            progress(report.scanned)
    return report


def _page(engine: Engine, key: Any, column: Any, after: str, batch: int) -> list[tuple[str, str]]:
    with read_connection(engine) as conn:
        rows = conn.execute(select(key, column).where(key > after).order_by(key).limit(batch))
        return [(r[0], r[1]) for r in rows]


def _classify(report: MigrationReport, raw: str, dry_run: bool, load: Callable[[], Any]) -> None:
    report.scanned += 1
    try:
        if not needs_work(raw):
            report.current += 1
            return
    except FutureVersionError:
        report.refused_newer += 1
        return
    except (ValueError, CorruptStateError, MigrationError):
        if not dry_run:
            _load_quietly(load)
        report.quarantined += 1
        return
    if not dry_run:
        load()
    report.migrated += 1


def _load_quietly(load: Callable[[], Any]) -> None:
    try:
        load()
    except CorruptStateError as exc:
        logger.warning("%s", exc)
