"""SQL shared by both session store implementations: new rows, history rows, the
guarded update and the documents built from rows."""

from __future__ import annotations

from sqlalchemy import Connection, Update, insert, text, update

from state import observe
from state.agent_set import AGENT_KEY
from state.clock import utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import LockLostError, StaleStateError
from state.events import revisions
from state.machine import Phase
from state.migrate import stamp
from state.session import SessionState, SessionStatus
from state.sessions.snapshot import SessionChange, Snapshot
from state.storage.db import dialect_insert
from state.storage.tables import messages, sessions


def new_document(session_id: str, user_id: str) -> Document:
    """The state document of a brand-new session (without history)."""
    doc = SessionState.new(session_id, user_id).to_document()
    doc.pop("message_history")
    return stamp(doc)


def full_document(snapshot: Snapshot, history: list[Document]) -> Document:
    """The session as one JSON-ready document (the seed's fields, phase, _version)."""
    doc = dict(snapshot.doc)
    doc.update(
        session_id=snapshot.session_id,
        user_id=snapshot.user_id,
        phase=snapshot.phase,
        status=snapshot.status,
        message_history=history,
        revision=snapshot.revision,
    )
    return doc


def insert_session(
    conn: Connection,
    session_id: str,
    user_id: str,
    agent: str | None = None,
    extra: Document | None = None,
) -> bool:
    """Create the session's row unless it exists (revision 0, idle, no history), with the
    record of its revision 0; True if it was created. ``agent``: the name of the agent
    (AGENTSTATE_AGENTS) its turns run, None for the default one (``state.agent_set``)."""
    now = utcnow()
    doc = new_document(session_id, user_id)
    if agent is not None:
        doc[AGENT_KEY] = agent
    doc.update(extra or {})  # keys of the caller's own (a LangGraph thread's metadata)
    stmt = dialect_insert(conn, sessions).values(
        session_id=session_id,
        user_id=user_id,
        phase=Phase.IDLE,
        status=SessionStatus.ACTIVE,
        revision=0,
        doc=doc,
        message_count=0,
        inbox_seq=0,
        event_seq=0,
        recoveries=0,
        agent=agent,
        created_at=now,
        updated_at=now,
    )
    created = conn.execute(
        stmt.on_conflict_do_nothing(index_elements=[sessions.c.session_id]).returning(
            sessions.c.session_id
        )
    ).first()
    if created is None:
        return False
    snapshot = Snapshot(session_id, user_id, Phase.IDLE, SessionStatus.ACTIVE, 0, doc, 0)
    revisions.record_whole(conn, snapshot, "created")
    return True


def insert_messages(
    conn: Connection, session_id: str, first_seq: int, items: list[Document]
) -> None:
    """Append history rows numbered from ``first_seq``."""
    if not items:
        return
    conn.execute(
        insert(messages),
        [
            {
                "session_id": session_id,
                "seq": first_seq + offset,
                "role": str(item.get("role", "user")),
                "content": str(item.get("content", "")),
                "timestamp": str(item.get("timestamp") or utcnow().isoformat()),
                "metadata": item.get("metadata") or {},
            }
            for offset, item in enumerate(items)
        ],
    )


def guarded_update(conn: Connection, snapshot: Snapshot, change: SessionChange) -> bool:
    """Write ``change`` to the row if it is still at ``snapshot.revision``; True if it was.

    A snapshot carried in a task message is untrusted: the row must also hold exactly
    it (Postgres compares the documents in jsonb's canonical text). Elsewhere nothing
    can check that, so such a write is refused as stale (its phase then reads the row).
    """
    statement = update(sessions).where(
        sessions.c.session_id == snapshot.session_id,
        sessions.c.revision == snapshot.revision,
    )
    if snapshot.carried:
        if conn.dialect.name != "postgresql":
            return False
        statement = _bound_to(statement, snapshot)
    result = conn.execute(
        statement.values(
            revision=snapshot.revision + 1,
            phase=change.phase,
            status=change.status,
            doc=change.doc,
            message_count=snapshot.message_count + len(change.new_messages),
            last_task_id=change.task_id,
            deadline_at=change.deadline_at,
            recoveries=0,
            updated_at=utcnow(),
        )
    )
    return result.rowcount == 1


def _bound_to(statement: Update, snapshot: Snapshot) -> Update:
    """``statement`` applying only to a row that holds exactly ``snapshot``."""
    seen_doc = text("sessions.doc::text = (CAST(:seen_doc AS jsonb))::text").bindparams(
        seen_doc=codec.dumps(snapshot.doc)
    )
    return statement.where(
        seen_doc,
        sessions.c.user_id == snapshot.user_id,
        sessions.c.phase == snapshot.phase,
        sessions.c.status == snapshot.status,
        sessions.c.message_count == snapshot.message_count,
        sessions.c.last_task_id.is_not_distinct_from(snapshot.last_task_id),
        sessions.c.deadline_at.is_not_distinct_from(snapshot.deadline_at),
    )


def stale(snapshot: Snapshot) -> StaleStateError:
    """The error of a writer that lost the race for ``snapshot.revision`` (its guarded
    commit was refused: counted as a fencing rejection)."""
    observe.current.commit_refused("session")
    return StaleStateError(
        f"session {snapshot.session_id} is no longer at revision {snapshot.revision}"
    )


def lock_lost(snapshot: Snapshot) -> LockLostError:
    """The error of a writer whose lock expired or was taken before it committed."""
    observe.current.commit_refused("lock_lost")
    return LockLostError(f"session {snapshot.session_id}: the state lock was lost before commit")
