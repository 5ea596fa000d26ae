"""Which agent a session runs: fixed by its first message, checked on every message that
names one (``AgentClient.send_message(..., agent=...)``).

A message that names no agent takes none of this (the usual one-statement accept): it goes
to the session's own agent, or opens a session of the default one. A message that names
one costs one more short transaction before its accept: the session is created for that
agent if it is new, and refused if it runs another. The agent never changes afterwards, so
the check cannot go stale before the accept.
"""

from __future__ import annotations

from sqlalchemy import Engine, select

from config.agents import DEFAULT_AGENT
from state.errors import BadInputError, SessionOwnershipError
from state.sessions.rows import insert_session
from state.storage.tables import sessions


def pin_agent(engine: Engine, session_id: str, user_id: str, agent: str) -> None:
    """Make sure the session runs ``agent`` (a configured name, ``default`` included):
    create it for ``agent`` if it is new. BadInputError, nothing stored, if it runs another
    agent; SessionOwnershipError if it is another user's."""
    with engine.begin() as conn:
        insert_session(conn, session_id, user_id, None if agent == DEFAULT_AGENT else agent)
        owner, current = conn.execute(
            select(sessions.c.user_id, sessions.c.agent).where(sessions.c.session_id == session_id)
        ).one()
    if owner != user_id:
        raise SessionOwnershipError(f"unknown session {session_id!r}")
    current = current or DEFAULT_AGENT
    if current != agent:
        raise BadInputError(
            f"session {session_id} runs agent {current!r}, not {agent!r}; a session keeps "
            "the agent of its first message (nothing was stored)"
        )


def agent_of(engine: Engine, session_id: str) -> str | None:
    """The name of the session's agent (None: no such session)."""
    with engine.connect() as conn:
        row = conn.execute(
            select(sessions.c.agent).where(sessions.c.session_id == session_id)
        ).first()
    return None if row is None else (row[0] or DEFAULT_AGENT)
