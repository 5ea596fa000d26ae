"""Human approval for apps, mixed into ``tasks.client.AgentClient``: list the approvals
waiting for a person and decide them. The first decision wins (one guarded commit); a
later one raises ApprovalAlreadyDecidedError and changes nothing."""

from __future__ import annotations

from functools import cached_property

from state.approvals.desk import ApprovalDesk
from state.approvals.rows import RESERVED_BY, Decision, is_reserved_by
from state.documents.codec import Document
from state.errors import InvalidPayloadError
from state.ids import validate_id
from tasks.client.control import RunControl

MAX_BY_CHARS = 128
MAX_NOTE_CHARS = 2000
MAX_LISTED = 1000


class ApprovalControl(RunControl):
    """Run control with human approval, for AgentClient (see the module docstring)."""

    @cached_property
    def _desk(self) -> ApprovalDesk:
        return ApprovalDesk(self.backend.engine, self._interventions, self.workflows)

    def approvals(self, user_id: str | None = None, pending: bool = True) -> list[Document]:
        """Approvals newest first (at most 1,000): only the undecided ones unless
        ``pending`` is False, only ``user_id``'s if given.

        Each is ``{approval_id, session_id, workflow_id, step_id, action, args,
        requested_at, expires_at, decision, approved, by, decided_at, note, user_id}``;
        ``decision`` is None, ``"approved"`` or ``"rejected"``.
        """
        if user_id is not None:
            validate_id(user_id, "user")
        if not isinstance(pending, bool):
            raise InvalidPayloadError("pending must be true or false")
        return self._desk.list(user_id, pending, MAX_LISTED)

    def decide(
        self,
        approval_id: str,
        approve: bool,
        by: str,
        note: str | None = None,
        user_id: str | None = None,
    ) -> Document:
        """Approve or reject an approval; return it as decided.

        A turn waiting for it goes on at once (approved: to ``executing``, where its
        handler gets ``ctx.approval``; rejected: to ``generating``); a workflow step
        waiting for it runs, or ends ``failed`` with ``error == "rejected"`` and its
        dependents skipped. Raises ApprovalAlreadyDecidedError if it was decided already
        (by a person, or ``"expired"``), ApprovalExpiredError at or after its
        ``expires_at`` (the expiry is recorded), NotFoundError for an unknown id or, with
        ``user_id``, another user's approval (nothing changed). ``by`` may not be one of
        the system's markers (``"expired"``, ``"cancelled"``, ...).
        """
        validate_id(approval_id, "approval")
        if not isinstance(approve, bool):
            raise InvalidPayloadError("approve must be true or false")
        if user_id is not None:
            validate_id(user_id, "user")
        decision = Decision(approve, _by(by), _note(note))
        return self._desk.decide(approval_id, decision, user_id)


def _by(by: object) -> str:
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_BY_CHARS or "\x00" in by:
        raise InvalidPayloadError(f"by must name who decides: 1-{MAX_BY_CHARS} characters")
    if is_reserved_by(by):
        raise InvalidPayloadError(
            f"by {by.strip()!r:.60} is reserved: the system records "
            f"{', '.join(sorted(RESERVED_BY))} when nobody decided"
        )
    return by.strip()


def _note(note: object) -> str | None:
    if note is None:
        return None
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS or "\x00" in note:
        raise InvalidPayloadError(f"note must be text of at most {MAX_NOTE_CHARS} characters")
    return note
