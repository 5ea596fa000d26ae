"""A session's event log: what each committed change tells, numbered 1, 2, 3... per
session, written in the transaction of the change.

The number comes from ``sessions.event_seq``, bumped under the session row's lock by every
writer that appends, so the events of one session commit in ``seq`` order and a reader
that sees an event sees every event before it.

Kinds agentstate writes (``data`` in brackets):

- ``message_accepted`` (message_id, text): a message joined the inbox (revision unchanged);
- ``turn_started`` (message_id): a turn took the message;
- ``phase_committed`` (from, trigger): closes every commit; ``phase`` is where it went;
- ``reply`` (message_id, text, kind): the assistant answered (kind: clarification,
  apology, cancelled, or null for a plain answer);
- ``turn_failed`` (cause, detail, phase) and ``turn_cancelled`` (message_id);
- ``workflow_started`` and ``workflow_finished`` (workflow_id[, status]);
- ``forked`` (source_session_id, source_revision): the first event of a fork;
- ``history_added`` and ``history_removed`` (count, source): items written to or removed
  from the history outside a turn (``state.sessions.items``: a framework's session);
- ``approval_requested`` (approval_id, action, args, expires_at) and ``approval_decided``
  (approval_id, approve, by, note): reserved for human approval, which appends them with
  :func:`append` in the transaction that asks or decides;
- anything a handler emits with ``ctx.emit(kind, data)``, committed with its phase.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Connection, Text, cast, func, insert, or_, select, update

from state.clock import iso, utcnow
from state.documents import codec
from state.documents.codec import Document, require_object
from state.errors import InvalidPayloadError
from state.sessions.snapshot import NewEvent
from state.storage.tables import events, sessions

MESSAGE_ACCEPTED = "message_accepted"
TURN_STARTED = "turn_started"
PHASE_COMMITTED = "phase_committed"
REPLY = "reply"
TURN_FAILED = "turn_failed"
TURN_CANCELLED = "turn_cancelled"
WORKFLOW_STARTED = "workflow_started"
WORKFLOW_FINISHED = "workflow_finished"
APPROVAL_REQUESTED = "approval_requested"
APPROVAL_DECIDED = "approval_decided"
FORKED = "forked"
HISTORY_ADDED = "history_added"
HISTORY_REMOVED = "history_removed"
BUILT_IN = frozenset(
    {
        MESSAGE_ACCEPTED,
        TURN_STARTED,
        PHASE_COMMITTED,
        REPLY,
        TURN_FAILED,
        TURN_CANCELLED,
        WORKFLOW_STARTED,
        WORKFLOW_FINISHED,
        APPROVAL_REQUESTED,
        APPROVAL_DECIDED,
        FORKED,
        HISTORY_ADDED,
        HISTORY_REMOVED,
    }
)

MAX_KIND_CHARS = 64
_KIND = re.compile(r"[a-z][a-z0-9_.]{0,63}")
_COLUMNS = (events.c.seq, events.c.kind, events.c.revision, events.c.phase, events.c.at)


def custom_event(kind: object, data: object, max_bytes: int) -> NewEvent:
    """The event a handler emits, checked: ``kind`` a short identifier that is not one of
    agentstate's own, ``data`` a JSON object of at most ``max_bytes`` (a copy is kept)."""
    if not isinstance(kind, str) or _KIND.fullmatch(kind) is None:
        raise InvalidPayloadError(
            f"event kind must be 1-{MAX_KIND_CHARS} characters: a lowercase letter, then "
            f"lowercase letters, digits, '_' or '.' (got {str(kind)[:80]!r})"
        )
    if kind in BUILT_IN:
        raise InvalidPayloadError(f"event kind {kind!r} is agentstate's own; use another name")
    payload = require_object({} if data is None else data, f"the data of event {kind!r}")
    text = codec.dumps(payload)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidPayloadError(
            f"the data of event {kind!r} is {size} bytes; the limit is {max_bytes} "
            "(AGENTSTATE_MAX_EVENT_BYTES)"
        )
    return NewEvent(kind, codec.loads(text))


def committed(from_phase: str, trigger: str | None) -> NewEvent:
    """The ``phase_committed`` event that closes every commit."""
    return NewEvent(PHASE_COMMITTED, {"from": from_phase, "trigger": trigger})


def reply_event(message: Document) -> NewEvent:
    """The ``reply`` event of an assistant history item."""
    metadata = message.get("metadata") or {}
    return NewEvent(
        REPLY,
        {
            "message_id": metadata.get("reply_to"),
            "text": message.get("content", ""),
            "kind": metadata.get("kind"),
        },
    )


def as_json(items: list[NewEvent]) -> str:
    """Events as one JSON array (the one-statement commit unpacks it in SQL)."""
    return codec.dumps([{"kind": e.kind, "data": e.data} for e in items])


def append(conn: Connection, session_id: str, items: list[NewEvent]) -> int | None:
    """Append ``items`` to the session's log inside ``conn``'s transaction, at the
    session's current revision and phase; return the last seq (None: no such session).

    The counter update takes the session row's lock (or waits for it), which orders this
    transaction's events after those of every writer that committed before it.
    """
    if not items:
        return None
    row = conn.execute(
        update(sessions)
        .where(sessions.c.session_id == session_id)
        .values(event_seq=sessions.c.event_seq + len(items))
        .returning(sessions.c.event_seq, sessions.c.revision, sessions.c.phase)
    ).first()
    if row is None:
        return None
    at = (int(row.revision), str(row.phase))
    insert_numbered(conn, session_id, items, last=int(row.event_seq), at=at)
    return int(row.event_seq)


def insert_numbered(
    conn: Connection, session_id: str, items: list[NewEvent], *, last: int, at: tuple[int, str]
) -> None:
    """Insert ``items`` numbered up to ``last``, which the caller took from the session
    row's counter (bumped by ``len(items)``) in this transaction, at the session's
    (revision, phase)."""
    revision, phase = at
    now, first = utcnow(), last - len(items) + 1
    rows = [
        {
            "session_id": session_id,
            "seq": first + offset,
            "kind": item.kind,
            "revision": revision,
            "phase": phase,
            "at": now,
            "data": item.data,
        }
        for offset, item in enumerate(items)
    ]
    # One row (the usual case) as a plain INSERT: the driver's executemany costs more.
    if len(rows) == 1:
        conn.execute(insert(events).values(rows[0]))
    else:
        conn.execute(insert(events), rows)


def read(conn: Connection, session_id: str, after: int, limit: int) -> list[Document]:
    """Up to ``limit`` events of the session with ``seq > after``, in ``seq`` order."""
    rows = conn.execute(
        select(*_COLUMNS, events.c.data)
        .where(events.c.session_id == session_id, events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return [as_document(row) for row in rows]


# A follower's page is bounded in bytes too: however long the log and its events, an
# open stream holds about this much of it (and at least one event).
PAGE_BYTES = 1 << 20


class Page(list[Document]):
    """Events read a page at a time; ``more``: the log goes on past this page."""

    more: bool = False


def read_generation(
    conn: Connection,
    session_id: str,
    generation: int,
    after: int,
    limit: int,
    *,
    max_bytes: int = PAGE_BYTES,
) -> Page | None:
    """:func:`read`, of the session's ``generation`` only, and at most ``max_bytes`` of
    event data (always at least one event): None if that generation is gone (erased or
    pruned, whoever took the id since). One statement, so the events read and the
    generation checked are of one snapshot."""
    size = func.length(cast(events.c.data, Text))
    found = (
        select(*_COLUMNS, events.c.data, size.label("size"))
        .select_from(
            sessions.outerjoin(
                events, (events.c.session_id == sessions.c.session_id) & (events.c.seq > after)
            )
        )
        .where(sessions.c.session_id == session_id, sessions.c.generation == generation)
        .order_by(events.c.seq)
        .limit(limit)
        .subquery()
    )
    # The running size over the page only (the LIMIT first), never over the whole log.
    sized = select(
        found,
        func.sum(found.c.size).over(order_by=found.c.seq).label("running"),
        func.count().over().label("rows"),
    ).subquery()
    rows = conn.execute(
        select(sized)
        .where(or_(sized.c.running.is_(None), sized.c.running - sized.c.size < max_bytes))
        .order_by(sized.c.seq)
    ).all()
    if not rows:
        return None
    page = Page(as_document(row) for row in rows if row.seq is not None)
    page.more = bool(page) and (rows[0].rows >= limit or len(rows) < rows[0].rows)
    return page


def as_document(row: Any) -> Document:
    """An events row as ``{seq, kind, revision, phase, at, data}``."""
    return {
        "seq": int(row.seq),
        "kind": row.kind,
        "revision": int(row.revision),
        "phase": row.phase,
        "at": iso(row.at),
        "data": codec.loads(row.data),
    }


def last_seq(conn: Connection, session_id: str) -> int:
    """The seq of the session's last event (0: none, or no such session): a follower that
    only wants what comes next starts after it, whatever the log's length."""
    row = conn.execute(
        select(sessions.c.event_seq).where(sessions.c.session_id == session_id)
    ).first()
    return 0 if row is None else int(row[0])
