"""Forking a session at a past revision: a new session of the same user, with the state
and history the source had then, resting, and an event log of its own."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, insert, literal, select
from sqlalchemy.exc import IntegrityError

from state.clock import utcnow
from state.errors import NotFoundError, SessionExistsError
from state.events import log
from state.events.feed import unknown
from state.events.revisions import at_revision, record_whole
from state.machine import Phase
from state.session import SessionStatus
from state.sessions.snapshot import Snapshot
from state.storage.tables import events, messages, sessions


def fork_session(
    engine: Engine, source_id: str, revision: int, new_id: str, user_id: str | None = None
) -> str:
    """Create ``new_id`` as ``source_id`` was at ``revision``, in one transaction.

    The fork rests (``idle``) whatever phase the source was in then; its history is the
    source's messages up to that revision, shared, not copied (``state.sessions.history``);
    its log starts with a ``forked`` event naming the source. The source is not touched.
    """
    with engine.begin() as conn:
        # Locked (shared) until the fork is in: a deletion of the source that runs
        # meanwhile then sees the fork and keeps its history readable.
        owner = conn.execute(
            select(sessions.c.user_id, sessions.c.prefix_session_id, sessions.c.prefix_count)
            .where(sessions.c.session_id == source_id)
            .with_for_update(read=True)
        ).first()
        if owner is None or (user_id is not None and owner[0] != user_id):
            raise unknown(source_id)
        past = at_revision(conn, source_id, revision)
        if past is None:
            raise NotFoundError(f"session {source_id} has no kept revision {revision}")
        doc = {**past.doc, "session_id": new_id, "phase": Phase.IDLE}
        doc["status"] = SessionStatus.ACTIVE
        fork = Snapshot(
            new_id, owner[0], Phase.IDLE, SessionStatus.ACTIVE, 0, doc, past.message_count
        )
        now = utcnow()
        holder, shared = _shared_prefix(source_id, owner[1], int(owner[2]), past.message_count)
        try:
            conn.execute(
                insert(sessions).values(
                    session_id=new_id,
                    user_id=fork.user_id,
                    phase=fork.phase,
                    status=fork.status,
                    revision=0,
                    doc=doc,
                    message_count=fork.message_count,
                    inbox_seq=0,
                    event_seq=1,
                    recoveries=0,
                    # A fork runs its source's agent (the document says so too).
                    agent=doc.get("agent"),
                    created_at=now,
                    updated_at=now,
                    prefix_session_id=holder,
                    prefix_count=shared,
                )
            )
        except IntegrityError as exc:
            raise SessionExistsError(
                f"session {new_id} already exists; fork into a new session id"
            ) from exc
        # Only what the source added after its own fork point is copied (a fork of a
        # fork): the rest is read from the session that holds it.
        copy_history(conn, source_id, new_id, shared, past.message_count)
        record_whole(conn, fork, "fork", event_seq=1)
        conn.execute(
            insert(events).values(
                session_id=new_id,
                seq=1,
                kind=log.FORKED,
                revision=0,
                phase=fork.phase,
                at=now,
                data={"source_session_id": source_id, "source_revision": revision},
            )
        )
    return new_id


def _shared_prefix(
    source_id: str, source_holder: str | None, source_shared: int, count: int
) -> tuple[str | None, int]:
    """Whose rows the fork reads for its first messages, and how many: the source's, or,
    when the source is a fork itself, the session it reads from (one level, always)."""
    if count == 0:
        return None, 0
    if source_holder is None:
        return source_id, count
    return source_holder, min(source_shared, count)


def copy_history(conn: Connection, source_id: str, new_id: str, start: int, end: int) -> None:
    """Copy ``source_id``'s own messages with ``start <= seq < end`` into ``new_id``."""
    if end <= start:
        return
    columns = ("seq", "role", "content", "timestamp", "metadata")
    rows = select(literal(new_id), *(messages.c[c] for c in columns)).where(
        messages.c.session_id == source_id, messages.c.seq >= start, messages.c.seq < end
    )
    conn.execute(insert(messages).from_select(["session_id", *columns], rows))
