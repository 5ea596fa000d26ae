"""What is done to a turn from outside its own phase tasks: the durable timeout firing,
the recovery sweep breaking or resuming a turn whose worker is gone, and answering a
message that can never run. Each is one guarded commit, so it applies once."""

from __future__ import annotations

import time

from sqlalchemy.exc import DBAPIError

from state import observe
from state.approvals.rows import Decision
from state.documents.codec import Document
from state.errors import NotFoundError, StaleStateError
from state.events.log import WORKFLOW_FINISHED
from state.machine import RESTING_PHASES, Phase, Trigger
from state.sessions.snapshot import Snapshot
from state.storage.db import lost_conflict
from state.turns import rules
from state.turns.deadlines import deadline_passed
from state.turns.draft import Draft, PhaseOutcome
from state.turns.services import TurnServices

CANCEL_ATTEMPTS = 20


class TurnInterventions:
    """Entry points of the timeout task and the recovery sweep."""

    def __init__(self, services: TurnServices) -> None:
        self.services = services

    def fire_timeout(self, session_id: str, deadline: float) -> PhaseOutcome:
        """Time the session out if it is still executing under ``deadline``."""
        outcome = PhaseOutcome(session_id, "not-due")
        snap = self.services.sessions.load_from_database(session_id)
        if snap is None or snap.phase != Phase.EXECUTING or snap.deadline_at != deadline:
            return outcome
        due = deadline + self.services.deadline_grace(snap)  # a workflow's recovery
        if time.time() < due:
            self.services.dispatcher.timeout(session_id, deadline, due - time.time())
            return outcome
        return self.break_turn(snap, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, rules.DEADLINE_PASSED)

    def break_turn(
        self, snap: Snapshot, trigger: Trigger | None, reply: str, cause: str
    ) -> PhaseOutcome:
        """End a turn that its worker cannot finish, with an apology and the cause kept."""
        draft = Draft(snap, None)
        rules.fail_turn(draft, trigger, reply, cause)
        return self._force_commit(snap, draft, trigger or "reset")

    def cancel_turn(self, session_id: str, user_id: str | None = None) -> bool:
        """End the running turn now (one guarded commit); False if none was running.

        If the turn commits a phase meanwhile, the cancel looks again and cancels the
        turn where it is now; a handler still running finds the revision moved and its
        result refused.
        """
        for _attempt in range(CANCEL_ATTEMPTS):
            snap = self.services.sessions.load_from_database(session_id)
            # A session's user never changes, and the commit below is guarded on this
            # very revision: the owner checked here is the owner of what is changed.
            if snap is None or (user_id is not None and snap.user_id != user_id):
                raise NotFoundError(f"unknown session {session_id!r}")
            if snap.phase in RESTING_PHASES:
                return False
            draft = Draft(snap, None)
            rules.cancel_turn(draft)
            try:
                self._force_commit(snap, draft, "cancelled")
            except StaleStateError:
                continue  # the turn moved on: look again
            except DBAPIError as exc:
                # Cancelling the workflow the turn waits on locks its steps after its
                # row, where a step's success locks them before: Postgres may end one to
                # break the deadlock. Nothing was written: look again.
                if not lost_conflict(exc):
                    raise
                continue
            # Counted where it committed: no phase task of this turn will report it.
            observe.current.turn_ended("cancelled")
            return True
        raise StaleStateError(f"session {session_id}: the turn kept moving; cancel again")

    def decide_approval(
        self,
        session_id: str,
        approval: Document,
        decision: Decision,
        user_id: str | None = None,
    ) -> bool:
        """Resume the turn that waits for ``approval`` with ``decision``, recording the
        decision in the same commit; False if the turn does not wait for it (the caller
        records the decision alone). Raises ApprovalAlreadyDecidedError if another
        decision committed first."""
        for _attempt in range(CANCEL_ATTEMPTS):
            snap = self.services.sessions.load_from_database(session_id)
            if snap is None or not _waits_for(snap, str(approval["approval_id"])):
                return False
            draft = Draft(snap, None)
            rules.decide_approval(draft, approval, decision, self.services.settings, user_id)
            try:
                outcome = self._force_commit(snap, draft, "decided")
            except StaleStateError:
                continue  # a message was accepted meanwhile: look again
            assert outcome.revision is not None
            self.services.dispatcher.phase(Phase(draft.phase), session_id, outcome.revision)
            return True
        raise StaleStateError(f"session {session_id}: kept changing; decide again")

    def end_overrun(self, draft: Draft, cause: str) -> PhaseOutcome:
        """End the turn of ``draft`` (at its checkpoint, before its handler's changes) with
        the timeout apology, while its handler is still running past its time limit."""
        rules.fail_turn(draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, cause)
        return self._force_commit(draft.snap, draft, "timeout")

    def reject_next_message(self, snap: Snapshot, cause: str) -> PhaseOutcome:
        """Answer the next queued message with an apology without running its turn."""
        item = self.services.inbox.next_queued(snap.session_id)
        if item is None or snap.phase not in RESTING_PHASES:
            return PhaseOutcome(snap.session_id, "nothing-to-do")
        draft = Draft(snap, None)
        rules.start_turn(draft, item)
        rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, cause)
        return self._force_commit(snap, draft, "rejected")

    def _force_commit(self, snap: Snapshot, draft: Draft, status: str) -> PhaseOutcome:
        # Commits without waiting for the lock: the worker that still holds it will find
        # the revision moved and its write refused. Its lock is freed here only if it is
        # still that worker's.
        sync, sessions = self.services.sync, self.services.sessions
        holder = sync.current_holder(snap.session_id)
        result = sessions.commit(snap, draft.change(), staged=draft.held_back)
        if holder is not None:
            sync.release_state_lock(snap.session_id, holder)
        sessions.publish(result.snapshot)
        notifier = self.services.notifier
        notifier.session(snap.session_id)
        for event in draft.events:
            if event.kind == WORKFLOW_FINISHED:
                notifier.workflow(str(event.data["workflow_id"]))
        if result.queued:
            self.services.dispatcher.phase(
                Phase.UNDERSTANDING, snap.session_id, result.snapshot.revision
            )
        outcome = PhaseOutcome(snap.session_id, status, [snap.phase], result.snapshot.revision)
        outcome.note_turn(draft.events)
        return outcome

    def resume(self, snap: Snapshot) -> str | None:
        """Re-enqueue whatever the persisted state says comes next; return what it was."""
        if snap.phase in (Phase.ERROR, Phase.TIMEOUT):
            self.break_turn(snap, None, rules.ERROR_REPLY, f"found in {snap.phase}")
            return "reset"
        if snap.phase == Phase.EXECUTING and deadline_passed(snap):
            self.fire_timeout(snap.session_id, snap.deadline_at or 0.0)
            return "timeout"
        queued = (
            snap.phase in RESTING_PHASES and self.services.inbox.queued_count(snap.session_id) > 0
        )
        phase = self.services.next_phase(snap, queued)
        if phase is not None:
            self.services.dispatcher.phase(phase, snap.session_id, snap.revision)
        return phase


def _waits_for(snap: Snapshot, approval_id: str) -> bool:
    context = snap.doc.get("context_window") or {}
    return (
        snap.phase == Phase.AWAITING_APPROVAL and context.get(rules.APPROVAL_ID_KEY) == approval_id
    )
