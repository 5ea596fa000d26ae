"""The one clock of state/: timezone-aware UTC, whatever the database hands back."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Now, timezone-aware in UTC."""
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """``moment`` with its zone, UTC when the database dropped it (SQLite does)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, or None."""
    if moment is None:
        return None
    return as_utc(moment).isoformat()
