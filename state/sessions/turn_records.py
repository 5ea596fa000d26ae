"""A turn read back by its message id, for the protocols that hand turns out as runs and
tasks (AG-UI, A2A, MCP): where the session's log stands, where the message is (its inbox
row), the reply it got, and the user's turns newest first. Reads only; the inbox row is
found by its primary key, the log's head on the session's row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from state.clock import iso
from state.documents import codec
from state.documents.codec import Document
from state.storage.tables import inbox, messages, sessions

# How many of a session's newest replies a lookup reads, a page at a time, before it
# gives up on finding an old turn's reply (the turn then reads as answered, no text).
REPLY_SCAN = 2000
_PAGE = 200


def head(conn: Connection, session_id: str) -> tuple[int, str] | None:
    """The seq of the session's last event and its user (None: no such session): where a
    follower of what happens next starts, whatever the log's length."""
    row = conn.execute(
        select(sessions.c.event_seq, sessions.c.user_id).where(sessions.c.session_id == session_id)
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


def message_state(conn: Connection, session_id: str, message_id: str) -> str | None:
    """Where a user message of the session is (an ``InboxState``; None: not the session's)."""
    found = conn.execute(
        select(inbox.c.state).where(
            inbox.c.message_id == message_id, inbox.c.session_id == session_id
        )
    ).scalar()
    return None if found is None else str(found)


def idempotency_keys(conn: Connection, session_id: str, message_ids: list[str]) -> dict[str, str]:
    """The idempotency key each of the session's ``message_ids`` was sent with (where one
    was): a protocol keeps its caller's own message ids there."""
    if not message_ids:
        return {}
    rows = conn.execute(
        select(inbox.c.message_id, inbox.c.idempotency_key).where(
            inbox.c.session_id == session_id,
            inbox.c.message_id.in_(message_ids),
            inbox.c.idempotency_key.is_not(None),
        )
    )
    return {str(row[0]): str(row[1]) for row in rows}


def message_row(conn: Connection, message_id: str) -> Document | None:
    """``{message_id, session_id, user_id, state, text, created_at}`` (None: unknown)."""
    row = conn.execute(
        select(
            inbox.c.message_id,
            inbox.c.session_id,
            sessions.c.user_id,
            inbox.c.state,
            inbox.c.text,
            inbox.c.created_at,
        )
        .join(sessions, sessions.c.session_id == inbox.c.session_id)
        .where(inbox.c.message_id == message_id)
    ).first()
    return None if row is None else _as_document(row)


def _as_document(row: Any) -> Document:
    return {
        "message_id": str(row[0]),
        "session_id": str(row[1]),
        "user_id": str(row[2]),
        "state": str(row[3]),
        "text": str(row[4]),
        "created_at": iso(row[5]),
    }


def reply_to(conn: Connection, session_id: str, message_id: str) -> Document | None:
    """The assistant message answering ``message_id`` (``{content, kind, timestamp}``),
    looked for among the session's newest :data:`REPLY_SCAN` replies."""
    before: int | None = None
    for _ in range(REPLY_SCAN // _PAGE):
        columns = (messages.c.seq, messages.c.content, messages.c.metadata, messages.c.timestamp)
        query = select(*columns).where(
            messages.c.session_id == session_id, messages.c.role == "assistant"
        )
        if before is not None:
            query = query.where(messages.c.seq < before)
        rows = conn.execute(query.order_by(messages.c.seq.desc()).limit(_PAGE)).all()
        for seq, content, meta, timestamp in rows:
            metadata = codec.loads(meta) if meta else {}
            if isinstance(metadata, dict) and metadata.get("reply_to") == message_id:
                return {"content": content, "kind": metadata.get("kind"), "timestamp": timestamp}
            before = int(seq)
        if len(rows) < _PAGE:
            return None
    return None


def user_turns(
    conn: Connection,
    user_id: str | None,
    session_id: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Document]:
    """Messages (turns) newest first: the user's, or one session's; ``after`` the
    ``(created_at, message_id)`` of the last one of the page before."""
    query = select(
        inbox.c.message_id,
        inbox.c.session_id,
        sessions.c.user_id,
        inbox.c.state,
        inbox.c.text,
        inbox.c.created_at,
    ).join(sessions, sessions.c.session_id == inbox.c.session_id)
    if user_id is not None:
        query = query.where(sessions.c.user_id == user_id)
    if session_id is not None:
        query = query.where(inbox.c.session_id == session_id)
    if after is not None:
        at, mid = after
        query = query.where(
            or_(inbox.c.created_at < at, and_(inbox.c.created_at == at, inbox.c.message_id < mid))
        )
    query = query.order_by(inbox.c.created_at.desc(), inbox.c.message_id.desc()).limit(limit)
    return [_as_document(row) for row in conn.execute(query)]
