"""Versioned state documents: every load upgrades to CURRENT_VERSION, step by step.

Upgrades are named functions in one ordered registry; adding a version means appending
one ``Migration`` (and a test), never an ``if version < n`` somewhere else.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from state.clock import utcnow
from state.documents.codec import Document
from state.errors import FutureVersionError, MigrationError

VERSION_KEY = "_version"


@dataclass(frozen=True)
class Migration:
    """Upgrades a document from ``from_version`` to ``from_version + 1``."""

    from_version: int
    name: str
    upgrade: Callable[[Document], Document]


def add_tool_results(doc: Document) -> Document:
    """v1 -> v2: documents gain a ``tool_results`` list."""
    doc.setdefault("tool_results", [])
    return doc


def reshape_message_history(doc: Document) -> Document:
    """v2 -> v3: history items become ``{role, content, timestamp, metadata}``."""
    history = doc.get("message_history")
    if history is None:
        history = []
    if not isinstance(history, list):
        raise MigrationError("message_history must be a list")
    doc["message_history"] = [_reshape_message(item) for item in history]
    return doc


def _reshape_message(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise MigrationError(f"history item must be an object, got {type(item).__name__}")
    metadata = item.get("metadata")
    return {
        "role": item.get("role", "user"),
        "content": item.get("content", ""),
        "timestamp": item.get("timestamp") or item.get("ts") or utcnow().isoformat(),
        "metadata": dict(metadata) if isinstance(metadata, dict) else {},
    }


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "add_tool_results", add_tool_results),
    Migration(2, "reshape_message_history", reshape_message_history),
)


def _latest_version(registry: tuple[Migration, ...]) -> int:
    for index, migration in enumerate(registry, start=1):
        if migration.from_version != index:
            raise MigrationError(f"migration {migration.name} is out of order")
    return len(registry) + 1


CURRENT_VERSION = _latest_version(MIGRATIONS)


class StateMigrator:
    """Upgrades state documents to ``CURRENT_VERSION`` through the ordered registry."""

    CURRENT_VERSION = CURRENT_VERSION
    MIGRATIONS = MIGRATIONS

    def version_of(self, doc: Document) -> int:
        """The document's version (a document without ``_version`` is v1)."""
        version = doc.get(VERSION_KEY, 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise MigrationError(f"{VERSION_KEY} must be a positive integer, got {version!r}")
        return version

    def needs_migration(self, doc: Document) -> bool:
        """True when ``doc`` is older than the running code (newer raises)."""
        return self._checked_version(doc) < self.CURRENT_VERSION

    def migrate(self, state: Document) -> Document:
        """A copy of ``state`` upgraded to CURRENT_VERSION; the input is never modified."""
        version = self._checked_version(state)
        doc = copy.deepcopy(state)
        for migration in self.MIGRATIONS[version - 1 :]:
            doc = migration.upgrade(doc)
        doc[VERSION_KEY] = self.CURRENT_VERSION
        return doc

    def _checked_version(self, doc: Document) -> int:
        if not isinstance(doc, dict):
            raise MigrationError(f"state must be a JSON object, got {type(doc).__name__}")
        version = self.version_of(doc)
        if version > self.CURRENT_VERSION:
            raise FutureVersionError(
                f"state is version {version} but this code only knows up to "
                f"{self.CURRENT_VERSION}: upgrade agentstate before loading it"
            )
        return version


def stamp(doc: Document) -> Document:
    """Mark a document written by the running code as current."""
    doc[VERSION_KEY] = CURRENT_VERSION
    return doc
