"""Run control for apps, mixed into ``tasks.client.AgentClient``: cancel a turn or a
workflow, retry a workflow from where it stopped, and list sessions and workflows.

Each control action is one guarded commit, so it applies once whatever races it: a
handler or step still running when its turn or workflow is cancelled has its result
refused when it tries to commit.
"""

from __future__ import annotations

from functools import cached_property

from config import Settings
from state.documents.codec import Document, require_text
from state.errors import InvalidPayloadError, NotFoundError, RunStateError
from state.ids import validate_id
from state.machine import Phase
from state.sessions.listing import list_sessions
from state.storage.backend import Backend
from state.turns.double_texting import MultitaskStrategy, parse_strategy
from state.turns.interventions import TurnInterventions
from state.turns.services import TurnServices
from state.turns.thread_edits import ThreadEdits
from state.workflow import WorkflowStatus
from state.workflows.engine import WorkflowEngine
from state.workflows.listing import list_workflows
from tasks.actions import known_actions
from tasks.dispatch.dispatcher import CeleryDispatcher

MAX_KEY_CHARS = 255


def require_key(key: object) -> str:
    """``key`` if it is a usable idempotency key (1-255 characters of text, no NUL)."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or "\x00" in key:
        raise InvalidPayloadError(f"idempotency_key must be 1-{MAX_KEY_CHARS} characters of text")
    return key


def checked_message(
    settings: Settings,
    session_id: str,
    text: str,
    user_id: str,
    key: str | None,
    *,
    strategy: object,
) -> MultitaskStrategy:
    """Check ``send_message``'s arguments (InvalidPayloadError and kin, nothing stored);
    return its strategy."""
    validate_id(session_id, "session")
    validate_id(user_id, "user")
    require_text(text, "message", settings.max_message_bytes)
    if key is not None:
        require_key(key)
    return parse_strategy(strategy)


class RunControl:
    """The run-control half of AgentClient (see the module docstring)."""

    settings: Settings
    backend: Backend
    dispatcher: CeleryDispatcher
    workflows: WorkflowEngine

    @cached_property
    def _interventions(self) -> TurnInterventions:
        return TurnInterventions(TurnServices.build(self.backend, self.dispatcher, known_actions))

    def cancel_turn(
        self, session_id: str, user_id: str | None = None, rollback: bool = False
    ) -> bool:
        """End the session's running turn now.

        The session rests again (``idle``) with one assistant message whose
        ``metadata.kind`` is ``"cancelled"``; a handler still running has its result
        refused; a workflow the turn waits on is cancelled too; messages queued after it
        still run. With ``rollback=True`` the turn is removed instead, as the
        double-texting ``rollback`` removes it: its message leaves the history and the
        session's document is as it was when the turn started. Returns False when no
        turn was running. With ``user_id``, another user's session raises NotFoundError,
        as an unknown id does, and is not touched.
        """
        validate_id(session_id, "session")
        _check_user(user_id)
        if rollback:
            return ThreadEdits(self._interventions.services).roll_back_turn(session_id, user_id)
        return self._interventions.cancel_turn(session_id, user_id)

    def append_messages(
        self, session_id: str, messages: list[Document], user_id: str | None = None
    ) -> int:
        """Append ``messages`` (``{"role": "user"|"assistant", "content": text,
        "metadata"?: {...}}``) to a resting session's history as one new revision, and
        return that revision. SessionBusyError if a turn runs or messages wait (nothing
        is stored); InvalidPayloadError for a malformed message; with ``user_id``,
        another user's session raises NotFoundError."""
        validate_id(session_id, "session")
        _check_user(user_id)
        if not isinstance(messages, list) or not messages:
            raise InvalidPayloadError("messages must be a non-empty list")
        items: list[tuple[str, str, Document]] = []
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise InvalidPayloadError("each message needs a role of 'user' or 'assistant'")
            content = message.get("content")
            require_text(content, "message", self.settings.max_message_bytes)
            metadata = message.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise InvalidPayloadError("a message's metadata must be an object")
            items.append((str(message["role"]), str(content), metadata))
        return ThreadEdits(self._interventions.services).append_messages(session_id, items, user_id)

    def cancel_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        """Cancel a running workflow: its status becomes ``cancelled``, every step not yet
        terminal ends ``skipped`` with ``error == "cancelled"``, and nothing of it runs
        afterwards. Returns the workflow. With ``user_id``, another user's workflow
        raises NotFoundError (the owner is guarded by the cancelling UPDATE itself)."""
        running = {WorkflowStatus.RUNNING}
        self._require_status(workflow_id, running, "cancel", user_id)
        if not self.workflows.cancel(workflow_id, user_id):
            self._require_status(workflow_id, running, "cancel", user_id)
        return self._workflow(workflow_id, user_id)

    def retry_workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        """Run a ``failed`` or ``cancelled`` workflow again from where it stopped: failed
        and skipped steps go back to ``pending`` (``retry_count`` 0), successful steps keep
        their outputs and never run again. Returns the workflow. With ``user_id``,
        another user's workflow raises NotFoundError."""
        retryable = {WorkflowStatus.FAILED, WorkflowStatus.CANCELLED}
        self._require_status(workflow_id, retryable, "retry", user_id)
        if not self.workflows.retry(workflow_id, user_id):
            self._require_status(workflow_id, retryable, "retry", user_id)
        return self._workflow(workflow_id, user_id)

    def list_sessions(
        self,
        user_id: str | None = None,
        phase: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Document:
        """Sessions newest first: ``{"items": [...], "next_cursor": str | None}``."""
        if user_id is not None:
            validate_id(user_id, "user")
        if phase is not None and phase not in set(Phase):
            raise InvalidPayloadError(f"phase must be one of {', '.join(Phase)}")
        page = list_sessions(
            self.backend.engine, user_id=user_id, phase=phase, limit=limit, cursor=cursor
        )
        return page.as_dict()

    def list_workflows(
        self,
        session_id: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        user_id: str | None = None,
    ) -> Document:
        """Workflows newest first: ``{"items": [...], "next_cursor": str | None}``; with
        ``user_id``, only the workflows that user owns."""
        if session_id is not None:
            validate_id(session_id, "session")
        _check_user(user_id)
        if status is not None and status not in set(WorkflowStatus):
            raise InvalidPayloadError(f"status must be one of {', '.join(WorkflowStatus)}")
        page = list_workflows(
            self.backend.engine,
            session_id=session_id,
            status=status,
            limit=limit,
            cursor=cursor,
            user_id=user_id,
        )
        return page.as_dict()

    def _require_status(
        self,
        workflow_id: str,
        allowed: set[WorkflowStatus],
        verb: str,
        user_id: str | None = None,
    ) -> None:
        validate_id(workflow_id, "workflow")
        _check_user(user_id)
        status = self.workflows.store.status(workflow_id, user_id)
        if status is None:
            raise NotFoundError(f"unknown workflow {workflow_id!r}")
        if status not in allowed:
            raise RunStateError(f"workflow {workflow_id} is {status}: nothing to {verb}")

    def _workflow(self, workflow_id: str, user_id: str | None = None) -> Document:
        doc = self.workflows.store.document(workflow_id, user_id)
        if doc is None:
            raise NotFoundError(f"unknown workflow {workflow_id!r}")
        return doc


def _check_user(user_id: str | None) -> None:
    if user_id is not None:
        validate_id(user_id, "user")
