"""Reading a session's history, forks included.

A fork shares its source's history up to the fork point instead of copying it: its row
names ``prefix_session_id`` and ``prefix_count``, its history is the source's first
``prefix_count`` messages followed by its own rows (numbered from ``prefix_count`` on).
A session that others share from never shares from another itself (``state.events.fork``
and ``state.lifecycle.rows`` keep it so), so one level is all a read follows.

A page costs its size: the session's own rows are one range read of the (session_id,
seq) index, and only a page that reaches below them (a fork's page that reaches the fork
point) reads the source's, with one more lookup.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from state.documents import codec
from state.documents.codec import Document
from state.storage.tables import messages, sessions

_COLUMNS = (
    messages.c.role,
    messages.c.content,
    messages.c.timestamp,
    messages.c["metadata"],
    messages.c.seq,
)


MAX_SEQ = 2**31 - 1  # messages.seq is an INTEGER


def read_history(
    conn: Connection, session_id: str, last: int | None = None, before_seq: int | None = None
) -> list[Document]:
    """The history in order (the newest ``last`` items before ``before_seq``, if given)."""
    if before_seq is not None and before_seq > MAX_SEQ:
        # Past every seq the column can hold: the same as no bound (and never a number
        # the database refuses as out of its column's range).
        before_seq = None
    rows = _range(conn, session_id, last, before_seq)
    lowest = int(rows[-1][4]) if last is not None and rows else (int(rows[0][4]) if rows else None)
    wanted = None if last is None else last - len(rows)
    if lowest != 0 and (wanted is None or wanted > 0) and before_seq != 0:
        shared = _shared(conn, session_id, lowest if lowest is not None else before_seq, wanted)
        rows = [*rows, *shared] if last is not None else [*shared, *rows]
    items = [
        {
            "role": r[0],
            "content": r[1],
            "timestamp": r[2],
            "metadata": codec.loads(r[3]),
            "seq": int(r[4]),
        }
        for r in rows
    ]
    return items[::-1] if last is not None else items


def _range(
    conn: Connection, session_id: str, last: int | None, before_seq: int | None
) -> list[Any]:
    """The rows of ``session_id`` itself: newest first when ``last`` is given."""
    query = select(*_COLUMNS).where(messages.c.session_id == session_id)
    if before_seq is not None:
        query = query.where(messages.c.seq < before_seq)
    if last is not None:
        query = query.order_by(messages.c.seq.desc()).limit(last)
    else:
        query = query.order_by(messages.c.seq)
    return list(conn.execute(query).all())


def _shared(conn: Connection, session_id: str, below: int | None, last: int | None) -> list[Any]:
    """The source's rows a fork shares, below ``below`` (newest first when ``last``)."""
    found = conn.execute(
        select(sessions.c.prefix_session_id, sessions.c.prefix_count).where(
            sessions.c.session_id == session_id
        )
    ).first()
    if found is None or found[0] is None or not found[1]:
        return []
    end = int(found[1]) if below is None else min(int(found[1]), below)
    return _range(conn, str(found[0]), last, end)
