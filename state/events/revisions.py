"""Every committed revision of a session, kept compactly, and the session as it was at any
of them.

A revision's row holds what the commit changed in the state document (``patch``: the
keys whose values changed, nested objects diffed key by key), or, every
:data:`CHECKPOINT_EVERY` revisions, the whole document (``doc``). It also holds the phase,
status, trigger and time, and the history length: the history at revision N is the
messages with ``seq < message_count``. Writing one costs the size of the document's
change, never of the history; reading revision N applies at most CHECKPOINT_EVERY - 1
patches to the checkpoint before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select

from state.clock import iso, utcnow
from state.documents import codec
from state.documents.codec import Document
from state.events import log
from state.sessions.snapshot import SessionChange, Snapshot
from state.storage.db import dialect_insert
from state.storage.tables import events, revisions, sessions

CHECKPOINT_EVERY = 32
_SET, _DELETE, _NESTED, _APPEND = "=", "-", "~", "+"


def diff(old: Document, new: Document) -> Document:
    """The patch that turns ``old`` into ``new`` (see :func:`apply`): per changed key,
    ``["=", value]``, ``["-"]`` (removed), ``["~", patch]`` (an object changed inside)
    or ``["+", items]`` (a list grown at its end, as a turn's path grows)."""
    patch: Document = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = [_SET, value]
            continue
        before = old[key]
        if before is value:  # a draft shares what it left alone
            continue
        if isinstance(before, dict) and isinstance(value, dict):
            inner = diff(before, value)
            if inner:
                patch[key] = [_NESTED, inner]
        elif same(before, value):
            continue
        elif _grown(before, value):
            patch[key] = [_APPEND, value[len(before) :]]
        else:
            patch[key] = [_SET, value]
    for key in old:
        if key not in new:
            patch[key] = [_DELETE]
    return patch


def apply(doc: Document, patch: Document) -> Document:
    """``doc`` with ``patch`` applied (a new object; ``doc`` is not changed)."""
    out = dict(doc)
    for key, op in patch.items():
        if op[0] == _SET:
            out[key] = op[1]
        elif op[0] == _DELETE:
            out.pop(key, None)
        elif op[0] == _APPEND:
            out[key] = [*out.get(key, []), *op[1]]
        else:
            before = out.get(key)
            out[key] = apply(before if isinstance(before, dict) else {}, op[1])
    return out


def _grown(before: Any, value: Any) -> bool:
    return (
        isinstance(before, list)
        and isinstance(value, list)
        and 0 < len(before) < len(value)
        and same(before, value[: len(before)])
    )


def same(a: Any, b: Any) -> bool:
    """JSON equality: ``1``, ``1.0`` and ``True`` differ (Python's ``==`` mixes them);
    a string enum equals its text."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        kind = _kind(a)
        if kind is not _kind(b):
            return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _kind(value: Any) -> type:
    # bool before int: it is one in Python, not in JSON.
    for kind in (bool, str, int, float, dict, list):
        if isinstance(value, kind):
            return kind
    return type(value)


@dataclass(frozen=True)
class RevisionValues:
    """What a commit records about its revision (doc or patch as JSON text)."""

    revision: int
    phase: str
    status: str
    trigger: str | None
    message_count: int
    doc: str | None
    patch: str | None


def values_of(snapshot: Snapshot, change: SessionChange, doc_text: str) -> RevisionValues:
    """The record of the revision ``change`` makes from ``snapshot`` (``doc_text`` is the
    new document as JSON, already serialized for the session row)."""
    new_revision = snapshot.revision + 1
    patch_text = codec.dumps(diff(snapshot.doc, change.doc))
    # A session's first write starts from a document the database never held: record it
    # whole. So too when the patch would be no smaller than the document.
    full = (
        not snapshot.stored
        or new_revision % CHECKPOINT_EVERY == 0
        or len(patch_text) >= len(doc_text)
    )
    return RevisionValues(
        revision=new_revision,
        phase=change.phase,
        status=change.status,
        trigger=change.trigger,
        message_count=snapshot.message_count + len(change.new_messages),
        doc=doc_text if full else None,
        patch=None if full else patch_text,
    )


def record(conn: Connection, snapshot: Snapshot, change: SessionChange) -> None:
    """Append the commit's events and its revision record (portable write path)."""
    closing = log.committed(snapshot.phase, change.trigger)
    last = log.append(conn, snapshot.session_id, [*change.events, closing])
    found = values_of(snapshot, change, codec.dumps(change.doc))
    conn.execute(
        insert(revisions).values(
            session_id=snapshot.session_id,
            revision=found.revision,
            phase=found.phase,
            status=found.status,
            trigger=found.trigger,
            at=utcnow(),
            message_count=found.message_count,
            event_seq=last or 0,
            doc=found.doc,
            patch=found.patch,
        )
    )


def record_whole(
    conn: Connection, snapshot: Snapshot, trigger: str | None, event_seq: int = 0
) -> None:
    """Record ``snapshot``'s revision with its whole document (a new session, a fork),
    replacing the document of the record there was (one migrated in place)."""
    values = {
        "phase": snapshot.phase,
        "status": snapshot.status,
        "trigger": trigger,
        "at": utcnow(),
        "message_count": snapshot.message_count,
        "event_seq": event_seq,
        "doc": codec.dumps(snapshot.doc),
        "patch": None,
    }
    stmt = dialect_insert(conn, revisions).values(
        session_id=snapshot.session_id, revision=snapshot.revision, **values
    )
    replaced = {"doc": values["doc"], "patch": None}
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[revisions.c.session_id, revisions.c.revision], set_=replaced
        )
    )


# What an UPDATE of many sessions returns for :func:`record_bulk` (after bumping each
# row's revision and event_seq by one).
BULK_COLUMNS = (
    sessions.c.session_id,
    sessions.c.revision,
    sessions.c.phase,
    sessions.c.status,
    sessions.c.message_count,
    sessions.c.event_seq,
)


def record_bulk(conn: Connection, rows: Sequence[Any], trigger: str) -> None:
    """Record a change made to many session rows at once that left their documents as
    they were (beat's expiry): one event and one revision record each."""
    if not rows:
        return
    now = utcnow()
    conn.execute(
        insert(events),
        [
            {
                "session_id": r.session_id,
                "seq": int(r.event_seq),
                "kind": log.PHASE_COMMITTED,
                "revision": int(r.revision),
                "phase": r.phase,
                "at": now,
                "data": {"from": r.phase, "trigger": trigger},
            }
            for r in rows
        ],
    )
    conn.execute(
        insert(revisions),
        [
            {
                "session_id": r.session_id,
                "revision": int(r.revision),
                "phase": r.phase,
                "status": r.status,
                "trigger": trigger,
                "at": now,
                "message_count": int(r.message_count),
                "event_seq": int(r.event_seq),
                "doc": None,
                "patch": "{}",
            }
            for r in rows
        ],
    )


def listing(
    conn: Connection, session_id: str, after: int = 0, limit: int | None = None
) -> list[Document]:
    """The session's kept revisions, oldest first: ``{revision, phase, trigger, at}``;
    only those above ``after`` (revision 0 too when ``after`` is 0), at most ``limit``. A
    page is one range read of the primary key."""
    query = (
        select(revisions.c.revision, revisions.c.phase, revisions.c.trigger, revisions.c.at)
        .where(revisions.c.session_id == session_id)
        .order_by(revisions.c.revision)
    )
    if after:
        query = query.where(revisions.c.revision > after)
    rows = conn.execute(query if limit is None else query.limit(limit))
    return [
        {"revision": int(r.revision), "phase": r.phase, "trigger": r.trigger, "at": iso(r.at)}
        for r in rows
    ]


@dataclass(frozen=True)
class PastRevision:
    """A session's state document as it was at one revision, with that revision's row."""

    revision: int
    phase: str
    status: str
    message_count: int
    event_seq: int
    doc: Document


def at_revision(conn: Connection, session_id: str, revision: int) -> PastRevision | None:
    """The session at ``revision``, rebuilt from the checkpoint before it and the patches
    since; None if that revision is not kept (never made, or pruned)."""
    base = (
        select(func.max(revisions.c.revision))
        .where(
            revisions.c.session_id == session_id,
            revisions.c.revision <= revision,
            revisions.c.doc.is_not(None),
        )
        .scalar_subquery()
    )
    rows = conn.execute(
        select(revisions)
        .where(
            revisions.c.session_id == session_id,
            revisions.c.revision >= base,
            revisions.c.revision <= revision,
        )
        .order_by(revisions.c.revision)
    ).all()
    if not rows or rows[-1].revision != revision or rows[0].doc is None:
        return None
    doc: Document = codec.loads(rows[0].doc)
    for row in rows[1:]:
        doc = codec.loads(row.doc) if row.doc is not None else apply(doc, codec.loads(row.patch))
    last = rows[-1]
    return PastRevision(
        revision=int(last.revision),
        phase=last.phase,
        status=last.status,
        message_count=int(last.message_count),
        event_seq=int(last.event_seq),
        doc=doc,
    )
