"""The reads both clients make, as plain functions of the stores: ``AgentClient`` calls
them directly, ``AsyncAgentClient`` inside its database bridge (database work only, no
Redis), so the two answer alike."""

from __future__ import annotations

from dataclasses import dataclass

from state.documents.codec import Document
from state.errors import NotFoundError
from state.events.feed import EventFeed
from state.machine import WAITING_PHASES
from state.paging import whole_number
from state.sessions.inbox import Inbox
from state.sessions.store import SessionStore, check_page_argument
from state.workflows.reads import WorkflowReads


@dataclass(frozen=True)
class SessionReads:
    """The stores a session read needs."""

    sessions: SessionStore
    inbox: Inbox
    feed: EventFeed

    def session(
        self,
        session_id: str,
        user_id: str | None,
        history_limit: int | None,
        before_seq: int | None,
        revision: int | None,
    ) -> Document | None:
        """``AgentClient.get_session`` (its arguments checked by the caller)."""
        check_page_argument("history_limit", history_limit)
        check_page_argument("before_seq", before_seq)
        if revision is not None:
            whole_number(revision, "revision")
            found = self.feed.owner(session_id)
            if found is None or (user_id is not None and found[0] != user_id):
                return None
            if found[1] != revision:
                return self.feed.session_at(
                    self.sessions, session_id, revision, history_limit, before_seq
                )
        doc = self.sessions.document(
            session_id, user_id=user_id, history_limit=history_limit, before_seq=before_seq
        )
        if doc is not None:
            doc["queued"] = self.inbox.queued_count(session_id)
        if doc is not None and revision is not None and doc["revision"] != revision:
            # It moved on while we read: read that revision from the record instead.
            return self.feed.session_at(
                self.sessions, session_id, revision, history_limit, before_seq
            )
        return doc

    def rested(
        self, session_id: str, user_id: str | None, history_limit: int | None, seen: Document
    ) -> Document | None:
        """The session if it rests with nothing queued (``wait_for_idle``'s check), else
        None; ``seen["phase"]`` says where it is. NotFoundError if unknown."""
        found = self.inbox.resting(session_id, user_id)
        if found is None:
            raise NotFoundError(f"unknown session {session_id!r}")
        seen["phase"], queued = found
        if seen["phase"] not in WAITING_PHASES or queued:
            return None
        return self.session(session_id, user_id, history_limit, None, None)


def finished_workflow(
    reads: WorkflowReads, workflow_id: str, user_id: str | None, seen: Document
) -> Document | None:
    """The workflow once every step is terminal (``wait_for_workflow``'s check), else
    None; ``seen["progress"]`` says how far it is. NotFoundError if unknown."""
    progress = reads.progress(workflow_id, user_id=user_id)
    if progress is None:
        raise NotFoundError(f"unknown workflow {workflow_id!r}")
    seen["progress"] = f"{progress.done}/{progress.total_steps} steps done"
    return reads.document(workflow_id, user_id) if progress.finished else None
