"""Which agent a session runs: fixed by its first message, checked on every message that
names one (``AgentClient.send_message(..., agent=...)``).

A message that names no agent takes none of this (the usual one-statement accept): it goes
to the session's own agent, or opens a session of the default one. A message that names
one costs one more short transaction before its accept: the session is created for that
agent if it is new, and refused if it runs another. A session opened without a message (a
LangGraph thread created before its first run) has no agent yet in that sense: its first
message still picks one. After a message, the agent never changes, so the check cannot go
stale before the accept.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, select, update

from config.agents import DEFAULT_AGENT
from state.agent_set import AGENT_KEY
from state.documents import codec
from state.documents.codec import Document
from state.errors import BadInputError, SessionOwnershipError
from state.sessions.rows import insert_session
from state.storage import keys
from state.storage.cache import StateCache
from state.storage.tables import sessions


def pin_agent(
    engine: Engine, session_id: str, user_id: str, agent: str, cache: StateCache | None = None
) -> None:
    """Make sure the session runs ``agent`` (a configured name, ``default`` included):
    create it for ``agent`` if it is new. BadInputError, nothing stored, if it runs another
    agent; SessionOwnershipError if it is another user's. ``cache``: where a copy of a
    session whose agent this call sets may be cached (it is dropped)."""
    named = None if agent == DEFAULT_AGENT else agent
    with engine.begin() as conn:
        insert_session(conn, session_id, user_id, named)
        owner, current, messages, doc = conn.execute(
            select(sessions.c.user_id, sessions.c.agent, sessions.c.inbox_seq, sessions.c.doc)
            .where(sessions.c.session_id == session_id)
            .with_for_update()
        ).one()
        if owner != user_id:
            raise SessionOwnershipError(f"unknown session {session_id!r}")
        current = current or DEFAULT_AGENT
        unset = current != agent and int(messages) == 0
        if unset:
            _set_agent(conn, session_id, codec.loads(doc), named)
    if unset:
        if cache is not None:
            cache.evict(keys.session_cache(session_id))
        return
    if current != agent:
        raise BadInputError(
            f"session {session_id} runs agent {current!r}, not {agent!r}; a session keeps "
            "the agent of its first message (nothing was stored)"
        )


def _set_agent(conn: Connection, session_id: str, doc: Document, agent: str | None) -> None:
    doc.pop(AGENT_KEY, None)
    if agent is not None:
        doc[AGENT_KEY] = agent
    conn.execute(
        update(sessions).where(sessions.c.session_id == session_id).values(agent=agent, doc=doc)
    )


def agent_of(engine: Engine, session_id: str) -> str | None:
    """The name of the session's agent (None: no such session)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(sessions.c.agent).where(sessions.c.session_id == session_id)
        ).first()
    return None if row is None else (row[0] or DEFAULT_AGENT)
