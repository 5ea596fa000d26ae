"""Cursor paging, newest first: a cursor is the (created_at, id) of the last item shown,
opaque to callers."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Engine, Select, tuple_

from state.clock import as_utc
from state.documents import codec
from state.errors import InvalidPayloadError
from state.storage.db import read_connection

MAX_PAGE = 1000
_MAX_CURSOR_CHARS = 600
# The largest value a database integer column (and so a bound parameter) holds: beyond
# it a driver raises its own DataError (a 500), so the argument is refused first.
MAX_WHOLE = 2**63 - 1


@dataclass(frozen=True)
class Page:
    """One page of a listing."""

    items: list[dict[str, Any]]
    next_cursor: str | None

    def as_dict(self) -> dict[str, Any]:
        """``{"items": [...], "next_cursor": str | None}``."""
        return {"items": self.items, "next_cursor": self.next_cursor}


def whole_number(value: object, name: str, *, low: int = 0, high: int = MAX_WHOLE) -> int:
    """``value`` if it is an int (not a bool) from ``low`` to ``high``, else
    InvalidPayloadError naming ``name``: every paging argument (``history_limit``,
    ``before_seq``, ``limit``, ``revision``, ``after``) goes through it, so none reaches
    the database out of range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InvalidPayloadError(
            f"{name} must be a whole number from {low} to {high}, got {shown}"
        )
    return value


def check_limit(limit: object) -> int:
    """``limit`` if it is a whole number from 1 to MAX_PAGE, else InvalidPayloadError."""
    return whole_number(limit, "limit", low=1, high=MAX_PAGE)


def encode(created_at: datetime, item_id: str) -> str:
    """The cursor after an item."""
    raw = codec.dumps([as_utc(created_at).isoformat(), item_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: object) -> tuple[datetime, str]:
    """The (created_at, id) a cursor stands for; InvalidPayloadError if it is not one."""
    refused = InvalidPayloadError("cursor is not one this listing returned")
    if not isinstance(cursor, str) or not 0 < len(cursor) <= _MAX_CURSOR_CHARS:
        raise refused
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        moment, item_id = codec.loads(base64.urlsafe_b64decode(padded))
        # An offset that moves the moment out of datetime's years overflows; a NUL is
        # no character of an id (and the driver refuses it): both are a bad cursor.
        if not isinstance(item_id, str) or "\x00" in item_id:
            raise refused
        return as_utc(datetime.fromisoformat(moment)), item_id
    except (ValueError, TypeError, OverflowError) as exc:
        raise refused from exc


def fetch(
    engine: Engine,
    query: Select[Any],
    keys: tuple[Column[Any], Column[Any]],
    summarize: Callable[[Any], dict[str, Any]],
    *,
    limit: int,
    cursor: str | None,
) -> Page:
    """One page of ``query``'s rows, newest first by ``keys`` (created_at, id), which an
    index must cover so that a page costs the same on a large table as on a small one."""
    check_limit(limit)
    created, ident = keys
    with read_connection(engine) as conn:
        rows = conn.execute(page_query(query, keys, limit=limit, cursor=cursor)).all()
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    following = encode(last._mapping[created], last._mapping[ident]) if last else None
    return Page([summarize(row) for row in rows[:limit]], following)


def page_query(
    query: Select[Any],
    keys: tuple[Column[Any], Column[Any]],
    *,
    limit: int,
    cursor: str | None,
) -> Select[Any]:
    """The query :func:`fetch` runs: one more row than ``limit`` (whether there is a
    next page), after ``cursor``."""
    created, ident = keys
    if cursor is not None:
        moment, item_id = decode(cursor)
        # A row-value comparison: an index condition on (..., created_at, id), so a page
        # deep in a listing reads what it returns, like the first (``created < m OR
        # (created = m AND id < x)`` is only a filter: every newer row is read and dropped).
        query = query.where(tuple_(created, ident) < tuple_(moment, item_id))
    return query.order_by(created.desc(), ident.desc()).limit(limit + 1)
