"""Edits made to a session from outside its turns, as LangGraph's Agent Server makes them
to a thread: messages appended to a resting session's history as a new revision (its
``update_state``), and the running turn rolled back as if its message had never been sent
(its ``cancel(action="rollback")``, what the double-texting rollback does, without a new
message). Each is one transaction that takes the session row's lock first, as the double
texting accept does, so racing senders and turns are ordered by it."""

from __future__ import annotations

from sqlalchemy import Connection, update

from state.documents.codec import Document
from state.errors import NotFoundError, SessionBusyError
from state.events import log
from state.machine import RESTING_PHASES, Phase
from state.session import make_message
from state.sessions.snapshot import Snapshot
from state.storage.tables import sessions
from state.turns.double_texting import DoubleTexting, MultitaskStrategy, _waiting
from state.turns.draft import Draft
from state.turns.services import TurnServices

ROLES = ("user", "assistant")


class ThreadEdits:
    """``append_messages`` and ``roll_back_turn`` (see the module docstring)."""

    def __init__(self, services: TurnServices) -> None:
        self.services = services

    def _locked(self, conn: Connection, session_id: str, user_id: str | None) -> Snapshot:
        # The row lock first: racing senders (and the turn's own commits) queue here.
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(inbox_seq=sessions.c.inbox_seq)
        )
        snap = self.services.sessions.load_in(conn, session_id)
        if snap is None or (user_id is not None and snap.user_id != user_id):
            raise NotFoundError(f"unknown session {session_id!r}")
        return snap

    def append_messages(
        self, session_id: str, items: list[tuple[str, str, Document]], user_id: str | None
    ) -> int:
        """Append ``(role, content, metadata)`` items to a resting session's history as
        one new revision; return it. SessionBusyError (nothing stored) if a turn runs or
        messages wait: the turn's own commits would race the edit."""
        for role, content, _ in items:
            if role not in ROLES or not isinstance(content, str):
                raise ValueError(f"a history item is (role in {ROLES}, text, metadata)")
        with self.services.sessions.engine.begin() as conn:
            snap = self._locked(conn, session_id, user_id)
            if snap.phase not in RESTING_PHASES or _waiting(conn, session_id):
                raise SessionBusyError(f"session {session_id} is busy; nothing was stored")
            draft = Draft(snap, None)
            draft.messages = [make_message(r, c, m) for r, c, m in items]
            draft.label = "update_state"
            done = self.services.sessions.commit_in(conn, snap, draft.change())
        self.services.sessions.publish(done)
        self.services.notifier.session(session_id)
        return done.revision

    def roll_back_turn(self, session_id: str, user_id: str | None) -> bool:
        """Remove the running turn as the double-texting rollback does (its message leaves
        the history, the document is as it was when the turn started); the messages
        waiting after it still run. False if no turn was running."""
        services = self.services
        holder = services.sync.current_holder(session_id)
        with services.sessions.engine.begin() as conn:
            snap = self._locked(conn, session_id, user_id)
            if snap.phase in RESTING_PHASES:
                return False
            ended, draft = DoubleTexting(services)._end(
                conn, snap, True, [], MultitaskStrategy.ROLLBACK
            )
            queued = bool(_waiting(conn, session_id))
        # As after a cancel: the worker still holding the lock finds its write refused.
        if holder is not None:
            services.sync.release_state_lock(session_id, holder)
        services.sessions.publish(ended)
        services.notifier.session(session_id)
        for event in draft.events:
            if event.kind == log.WORKFLOW_FINISHED:
                services.notifier.workflow(str(event.data["workflow_id"]))
        if queued:  # the next message's turn starts now
            services.dispatcher.phase(Phase.UNDERSTANDING, session_id, ended.revision)
        return True
