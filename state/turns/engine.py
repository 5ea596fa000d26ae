"""The turn engine: runs one phase of one session, exactly once, then hands over.

A phase run is: lock the session (one Redis round trip that also reads the cache) ->
check that this delivery is for the revision the session is at (else it is a duplicate
and is dropped) -> call the agent's handler -> fire the trigger on the FSM -> commit the
handler's changes with the revision bump in one transaction (guarded, lock checked) ->
write the cache and release the lock (one round trip) -> enqueue the next phase.

The rules of a turn are in ``state.turns.rules``; the durable timeout in
``state.turns.deadlines``; what the recovery sweep and the timeout task call in
``state.turns.interventions``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from state.agent import Agent, PhaseContext
from state.documents.codec import Document
from state.errors import StaleStateError, StateLockAcquisitionError, UnstorableResultError
from state.events.log import WORKFLOW_FINISHED, custom_event
from state.lock import LockHandle
from state.machine import RESTING_PHASES, Phase, Trigger
from state.sessions.snapshot import CommitResult, Snapshot
from state.storage import keys
from state.storage.cache import CachedEntry
from state.turns import rules
from state.turns.deadlines import alarm, deadline_passed, ring_at
from state.turns.draft import Delivery, Draft, Followups, PhaseOutcome
from state.turns.interventions import TurnInterventions
from state.turns.services import TurnServices

logger = logging.getLogger(__name__)

KICK_LOCK_WAIT_S = 0.5
PHASE_LOCK_WAIT_S = 5.0
_OVERRUN = "execution deadline passed"


@dataclass
class _Held:
    """What a delivery holds while it runs: the lock, the cached entry read with it, what
    to send after the commit, and what to report."""

    handle: LockHandle
    entry: CachedEntry | None
    outcome: PhaseOutcome
    followups: Followups = field(default_factory=Followups)


class TurnEngine:
    """Runs phases of sessions against the store, the lock and the agent."""

    def __init__(self, services: TurnServices, agent: Agent) -> None:
        self.services = services
        self.agent = agent
        self.interventions = TurnInterventions(services)

    def run_phase(self, delivery: Delivery) -> PhaseOutcome:
        """Run the delivered phase (and, under the inline policy, the quick ones after it)."""
        sync = self.services.sync
        try:
            handle, entry = sync.acquire(
                delivery.session_id, read_cache=True, timeout_s=self._lock_wait_s(delivery.phase)
            )
        except StateLockAcquisitionError:
            if delivery.phase == Phase.UNDERSTANDING and self._mid_turn(delivery.session_id):
                # The running turn takes the next message from the inbox when it ends.
                return PhaseOutcome(delivery.session_id, "busy")
            raise
        held = _Held(
            handle,
            entry if delivery.use_cache else None,
            PhaseOutcome(delivery.session_id, "nothing-to-do"),
        )
        published = False
        try:
            snap = self._run_locked(delivery, held)
            if snap is None:
                return held.outcome
            sync.publish_and_release(handle, snap)
            published = True
            self._send(snap.session_id, held.followups)
            held.outcome.revision = snap.revision
            return held.outcome
        finally:
            if not published:
                sync.release(handle)
                if held.outcome.phases:  # committed, then failed: still wake followers
                    self.services.notifier.session(delivery.session_id)

    def _run_locked(self, delivery: Delivery, held: _Held) -> Snapshot | None:
        for entry in (held.entry, None):
            snap, from_cache = self._load(delivery, entry)
            if snap is None:
                held.outcome.status = "unknown-session"
                return None
            if not self._due(delivery, snap):
                if delivery.task_id is not None and snap.last_task_id == delivery.task_id:
                    # Our commit landed but its follow-ups may not have.
                    self.interventions.resume(snap)
                held.outcome.status = "duplicate"
                held.outcome.revision = snap.revision
                return None
            if not self.agent.is_quick(delivery.phase):
                self.services.sync.keep_renewed(held.handle)
            held.outcome.revision = snap.revision
            try:
                return self._run_phases(delivery.phase, snap, delivery.task_id, held)
            except StaleStateError:
                if not from_cache or held.outcome.phases:
                    raise
                # The cached copy was behind: its writer died between commit and cache
                # write. Nothing was applied; look at the database and try once more.
        raise AssertionError("unreachable")

    def _run_phases(
        self, phase: Phase | None, snap: Snapshot, task_id: str | None, held: _Held
    ) -> Snapshot:
        while phase is not None:
            draft = self._draft(phase, snap, task_id)
            if draft is None:
                break
            result = self._commit(snap, draft, held.handle)
            snap = result.snapshot
            held.outcome.phases.append(phase)
            held.outcome.status = "applied"
            self._after_commit(draft, held.followups)
            phase = self.services.next_phase(snap, result.queued)
            if phase is not None and not self._inline(phase):
                held.followups.phase = (phase, snap.revision)
                phase = None
        return snap

    def _commit(self, snap: Snapshot, draft: Draft, handle: LockHandle) -> CommitResult:
        still_held = partial(self.services.sync.surely_held, handle)
        sessions = self.services.sessions
        try:
            return sessions.commit(snap, draft.change(), still_held)
        except UnstorableResultError as exc:
            logger.warning(
                "session %s: result of %s not storable: %s", snap.session_id, snap.phase, exc
            )
            rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, str(exc))
            return sessions.commit(snap, draft.change(), still_held)

    def _lock_wait_s(self, phase: Phase) -> float:
        # A kick only needs to know the session is busy; a phase waits a while for a
        # quick holder, then the task retries later instead of blocking a worker.
        limit = KICK_LOCK_WAIT_S if phase == Phase.UNDERSTANDING else PHASE_LOCK_WAIT_S
        return min(limit, self.services.settings.lock_timeout)

    def _mid_turn(self, session_id: str) -> bool:
        snap = self.services.sessions.load_from_database(session_id)
        return snap is not None and snap.phase not in RESTING_PHASES

    def _load(self, delivery: Delivery, entry: CachedEntry | None) -> tuple[Snapshot | None, bool]:
        """The snapshot to work on, and whether it came from the cache."""
        sessions = self.services.sessions
        if entry is not None and delivery.revision is not None and entry[0] == delivery.revision:
            cached = sessions.cached_from_entry(delivery.session_id, entry)
            if cached is not None:
                return cached, True
        return sessions.load_from_database(delivery.session_id), False

    def _due(self, delivery: Delivery, snap: Snapshot) -> bool:
        if delivery.phase == Phase.UNDERSTANDING:
            # Starting a turn is due whenever the session rests (a queued message is
            # checked next); the revision a kick carries only picks the cached copy.
            return snap.phase in RESTING_PHASES
        expected = delivery.revision
        return snap.phase == delivery.phase and (expected is None or snap.revision == expected)

    def _inline(self, phase: Phase) -> bool:
        return self.services.inline and self.agent.is_quick(phase)

    # -- building a phase's change ---------------------------------------------

    def _draft(self, phase: Phase, snap: Snapshot, task_id: str | None) -> Draft | None:
        draft = Draft(snap, task_id)
        if phase == Phase.UNDERSTANDING:
            item = self.services.inbox.next_queued(snap.session_id)
            if item is None:
                return None
            rules.start_turn(draft, item)
        elif phase == Phase.EXECUTING and self.services.waiting_on_workflow(snap):
            return None
        draft.checkpoint()
        if deadline_passed(draft.snap):
            rules.fail_turn(
                draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, "execution deadline passed"
            )
            return draft
        try:
            self._run_handler(phase, draft)
        except StaleStateError:
            raise
        except Exception as exc:
            # The handler (or what it returned) failed: the agent's fault, not ours.
            logger.warning("session %s: %s handler failed: %r", snap.session_id, phase, exc)
            detail = f"{type(exc).__name__}: {exc}"
            rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, detail)
            return draft
        if deadline_passed(draft.snap):
            # The handler overran: its result arrives too late to count.
            rules.fail_turn(
                draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, "execution deadline passed"
            )
        return draft

    def _run_handler(self, phase: Phase, draft: Draft) -> None:
        with alarm(draft.snap, self.services.dispatcher):
            result = self.agent.run(phase, self._context(phase, draft))
        rules.apply_result(
            phase,
            draft,
            result,
            execution_timeout_s=self.services.settings.execution_timeout,
            known_actions=self.services.known_actions,
        )
        draft.check_storable()

    def _context(self, phase: Phase, draft: Draft) -> PhaseContext:
        snap = draft.snap
        sessions, users = self.services.sessions, self.services.users
        return PhaseContext(
            session_id=snap.session_id,
            user_id=snap.user_id,
            phase=phase,
            message=str(draft.context.get("message", "")),
            message_id=str(draft.context.get("message_id", "")),
            context=dict(draft.context),
            tool_results=list(draft.doc.get("tool_results") or []),
            pending_actions=list(draft.doc.get("pending_actions") or []),
            metadata=dict(draft.metadata),
            workflow=self._finished_workflow(draft) if phase == Phase.EXECUTING else None,
            attempt=int(draft.context.get("attempt", 1)),
            history_reader=lambda n: sessions.history(snap.session_id, last=n),
            user_state_reader=lambda: users.load_user_state(snap.user_id),
            event_sink=partial(self._emit, draft),
        )

    def _emit(self, draft: Draft, kind: str, data: Document | None) -> None:
        settings = self.services.settings
        draft.emit(
            custom_event(kind, data, settings.max_event_bytes), settings.max_events_per_phase
        )

    def _finished_workflow(self, draft: Draft) -> Document | None:
        workflow_id = draft.context.get("workflow_id")
        return self.services.workflows.document(workflow_id) if workflow_id else None

    # -- after a commit --------------------------------------------------------

    def _after_commit(self, draft: Draft, followups: Followups) -> None:
        followups.steps.extend(draft.roots)
        followups.finished.extend(
            str(e.data["workflow_id"]) for e in draft.events if e.kind == WORKFLOW_FINISHED
        )
        followups.user_cache.extend(draft.user_writes)
        if draft.phase == Phase.EXECUTING and draft.roots:
            # Waiting on a workflow: an in-process alarm rings the deadline check.
            followups.deadline = draft.deadline

    def _send(self, session_id: str, followups: Followups) -> None:
        dispatcher = self.services.dispatcher
        for user_id, revision, doc in followups.user_cache:
            self.services.cache.put(keys.user_state_cache(user_id), revision, doc)
        for workflow_id, step_id, revision in followups.steps:
            dispatcher.step(workflow_id, step_id, revision)
        for workflow_id in followups.finished:
            self.services.notifier.workflow(workflow_id)
        if followups.deadline is not None:
            ring_at(session_id, followups.deadline, dispatcher)
        if followups.phase is not None:
            dispatcher.phase(followups.phase[0], session_id, followups.phase[1])
