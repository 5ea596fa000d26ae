"""Unreadable stored documents are moved aside here instead of crashing every load."""

from __future__ import annotations

from sqlalchemy import Connection, insert, select

from state.clock import utcnow
from state.storage.tables import quarantine as quarantine_table

_MAX_PAYLOAD_CHARS = 1_000_000


def quarantine(conn: Connection, kind: str, key: str, payload: str, reason: str) -> None:
    """Keep ``payload`` verbatim with the reason it could not be read."""
    conn.execute(
        insert(quarantine_table).values(
            kind=kind,
            key=key,
            payload=payload[:_MAX_PAYLOAD_CHARS],
            reason=reason[:2000],
            created_at=utcnow(),
        )
    )


def quarantined(conn: Connection, kind: str, key: str) -> list[tuple[str, str]]:
    """``(payload, reason)`` of everything quarantined for one key, oldest first."""
    rows = conn.execute(
        select(quarantine_table.c.payload, quarantine_table.c.reason)
        .where(quarantine_table.c.kind == kind, quarantine_table.c.key == key)
        .order_by(quarantine_table.c.id)
    )
    return [(r[0], r[1]) for r in rows]
