"""The turn engine: runs one phase of one session, exactly once, then hands over.

A phase run is: lock the session (one Redis round trip that also reads the cache) ->
check that this delivery is for the revision the session is at (else it is a duplicate
and is dropped) -> call the agent's handler -> fire the trigger on the FSM -> commit the
handler's changes with the revision bump in one transaction (guarded, lock checked) ->
write the cache and release the lock (one round trip) -> enqueue the next phase.

A quick phase whose message carries the snapshot it continues from (Postgres,
AGENTSTATE_CARRY_SNAPSHOT) takes no lock and reads nothing: the message is untrusted,
so its commit lands only if the row still holds exactly that snapshot at that revision
(the revision guard fences concurrent writers as it does for a lost lock). If it does
not land, the phase runs once more the usual way, locked, from the database.

The rules of a turn are in ``state.turns.rules``; the durable timeout in
``state.turns.deadlines``; calling the agent's handler in ``state.turns.handlers``; what
the recovery sweep and the timeout task call in ``state.turns.interventions``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from state import observe
from state.agent import Agent
from state.agent_set import AgentSet
from state.documents import codec
from state.errors import (
    LockLostError,
    StaleStateError,
    StateLockAcquisitionError,
    UnstorableResultError,
)
from state.lock import LockHandle
from state.machine import RESTING_PHASES, WORK_PHASES, Phase, Trigger
from state.recovery.queries import note_redelivery
from state.sessions.snapshot import CommitResult, SessionChange, Snapshot, Staged
from state.storage.cache import CachedEntry
from state.turns import carry, followups, rules
from state.turns.deadlines import deadline_passed
from state.turns.draft import Delivery, Draft, PhaseOutcome
from state.turns.followups import Followups
from state.turns.handlers import PhaseHandlers
from state.turns.interventions import TurnInterventions
from state.turns.services import TurnServices

logger = logging.getLogger(__name__)

KICK_LOCK_WAIT_S = 0.5
PHASE_LOCK_WAIT_S = 5.0


@dataclass
class _Held:
    """What a delivery holds while it runs: the lock, the copy it starts from, what to
    send after the commit, and what to report."""

    handle: LockHandle | None  # None: a quick phase run from a carried snapshot
    first: Snapshot | None  # the cached copy to try before the database
    outcome: PhaseOutcome
    followups: Followups = field(default_factory=Followups)
    give_up: str | None = None  # why the turn ends now instead of running its handler
    # Commits of quick phases held back to travel with the next commit (inline policy).
    staged: list[tuple[Phase, Staged]] = field(default_factory=list)


class TurnEngine:
    """Runs phases of sessions against the store, the lock and the agent."""

    def __init__(self, services: TurnServices, agent: Agent | AgentSet) -> None:
        self.services = services
        # Every agent of the deployment; a session's turn runs its own (``AgentSet.of``).
        self.agents = agent if isinstance(agent, AgentSet) else AgentSet(agent)
        self.agent = self.agents.default
        self.interventions = TurnInterventions(services)
        self.handlers = PhaseHandlers(services, self.agents, self.interventions)

    def run_phase(self, delivery: Delivery) -> PhaseOutcome:
        """Run the delivered phase (and, under the inline policy, the quick ones after it)."""
        if delivery.redelivered:
            # Counted before waiting for the lock (its lost worker's lock may outlive it),
            # so the retry that follows a long wait finds the count in the row.
            session_id, phase, revision = delivery.session_id, delivery.phase, delivery.revision
            engine, stuck_after = self.services.sessions.engine, self.services.settings.stuck_after
            note_redelivery(engine, session_id, phase, revision, stuck_after)
        carried = carry.carried(self.services, self.agents, delivery)
        if carried is not None and self._due(delivery, carried):
            outcome = self._run_unlocked(delivery, carried)
            if outcome is not None:
                return outcome
            # Not committed: the snapshot was stale or forged. The database decides.
            delivery = replace(delivery, use_cache=False)
        return self._run_with_lock(delivery)

    def _run_with_lock(self, delivery: Delivery) -> PhaseOutcome:
        sync = self.services.sync
        waited_from = time.perf_counter()
        try:
            handle, entry = sync.acquire(
                delivery.session_id, read_cache=True, timeout_s=self._lock_wait_s(delivery.phase)
            )
            observe.current.lock_waited(time.perf_counter() - waited_from)
        except StateLockAcquisitionError:
            observe.current.lock_waited(time.perf_counter() - waited_from)
            if delivery.phase == Phase.UNDERSTANDING and self._mid_turn(delivery.session_id):
                # The running turn takes the next message from the inbox when it ends.
                return PhaseOutcome(delivery.session_id, "busy")
            raise
        held = _Held(
            handle,
            self._from_entry(delivery, entry) if delivery.use_cache else None,
            PhaseOutcome(delivery.session_id, "nothing-to-do"),
        )
        published = False
        try:
            snap = self._run_locked(delivery, held)
            if snap is None:
                return held.outcome
            # The user states this commit changed are cached before the push that
            # announces it: a follower woken by the push must not read an older copy.
            followups.cache_user_states(self.services, held.followups)
            payload = codec.dumps(snap.to_cache())
            followups.send_carrying(self.services, self.agents, snap, held.followups, payload)
            sync.publish_and_release(handle, snap, payload)
            published = True
            followups.send(self.services, snap, held.followups)
            held.outcome.revision = snap.revision
            return held.outcome
        finally:
            if not published:
                sync.release(handle)
                if held.outcome.phases:  # committed, then failed: still wake followers
                    self.services.notifier.session(delivery.session_id)

    def _run_unlocked(self, delivery: Delivery, snap: Snapshot) -> PhaseOutcome | None:
        """Run a quick phase from the snapshot its message carries, without the lock; None
        if its commit found the row elsewhere (nothing was written)."""
        held = _Held(None, None, PhaseOutcome(delivery.session_id, "nothing-to-do"))
        held.outcome.revision = snap.revision
        try:
            snap = self._run_phases(delivery.phase, snap, delivery.task_id, held)
            if not held.outcome.phases:
                return held.outcome  # nothing to do (no queued message): nothing to cache
            followups.cache_user_states(self.services, held.followups)
            payload = codec.dumps(snap.to_cache())
            followups.send_carrying(self.services, self.agents, snap, held.followups, payload)
            self.services.sync.publish(snap, payload)
            followups.send(self.services, snap, held.followups)
        except BaseException as exc:
            if not held.outcome.phases:
                if isinstance(exc, StaleStateError):
                    return None
                raise
            self.services.notifier.session(delivery.session_id)  # committed: still wake
            raise
        held.outcome.revision = snap.revision
        return held.outcome

    def _run_locked(self, delivery: Delivery, held: _Held) -> Snapshot | None:
        for first in (held.first, None):
            # A second attempt starts over: nothing of the first was applied.
            held.staged.clear()
            held.followups = Followups()
            snap, from_cache = self._load(delivery, first)
            if snap is None:
                held.outcome.status = "unknown-session"
                # Erased while a handler streamed: its late chunks must not outlive it.
                self.services.tokens.forget(delivery.session_id)
                return None
            if not self._due(delivery, snap):
                if delivery.task_id is not None and snap.last_task_id == delivery.task_id:
                    # Our commit landed but its follow-ups may not have.
                    self.interventions.resume(snap)
                held.outcome.status = "duplicate"
                held.outcome.revision = snap.revision
                return None
            assert held.handle is not None
            agent = self.agents.of(snap.doc)
            if not agent.is_quick(delivery.phase) or self._limit_outlasts_lease():
                self.services.sync.keep_renewed(held.handle)
            held.outcome.revision = snap.revision
            held.give_up = self._given_up(snap)
            try:
                return self._run_phases(delivery.phase, snap, delivery.task_id, held)
            except LockLostError:
                raise  # another worker may own the turn now: do not run the phase again
            except StaleStateError:
                if not from_cache or held.outcome.phases:
                    raise
                # The cached copy was behind: its writer died between commit and cache
                # write. Nothing was applied; look at the database and try once more.
        raise AssertionError("unreachable")

    def _run_phases(
        self, phase: Phase | None, snap: Snapshot, task_id: str | None, held: _Held
    ) -> Snapshot:
        give_up = held.give_up
        while phase is not None:
            draft = self._draft(phase, snap, task_id, give_up, held)
            give_up = None
            if draft is None:
                break
            result = self._commit(phase, snap, draft, held)
            held.outcome.note_turn(draft.events)
            snap = result.snapshot
            followups.collect(draft, held.followups)
            phase = self.services.next_phase(snap, result.queued)
            if phase is not None and not self._inline(phase, snap):
                held.followups.phase = (phase, snap.revision)
                phase = None
        self._flush(held)
        return snap

    def _commit(self, phase: Phase, snap: Snapshot, draft: Draft, held: _Held) -> CommitResult:
        try:
            return self._write(phase, snap, draft.change(), held)
        except UnstorableResultError as exc:
            logger.warning(
                "session %s: result of %s not storable: %s", snap.session_id, snap.phase, exc
            )
            rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, str(exc))
            return self._write(phase, snap, draft.change(), held)

    def _write(
        self, phase: Phase, snap: Snapshot, change: SessionChange, held: _Held
    ) -> CommitResult:
        """Commit ``change`` with the commits held back before it, or hold it back too
        when the next phase is quick and runs here (:meth:`_may_stage`)."""
        sessions = self.services.sessions
        if self._may_stage(phase, snap, change):
            staged = sessions.stage(snap, change)
            if staged is not None:
                held.staged.append((phase, staged))
                return CommitResult(staged.snapshot, queued=False)
        pending = [staged for _, staged in held.staged]
        result = sessions.commit(snap, change, self._still_held(held), pending)
        self._applied(held, phase)
        return result

    def _may_stage(self, phase: Phase, snap: Snapshot, change: SessionChange) -> bool:
        # A quick phase's commit may travel with the next phase's when that one is quick
        # and runs here: nothing leaves this process in between (no side effect, no
        # broker hop), so the two checkpoints land together or not at all, and a lost
        # worker's turn resumes from the one before them, as it would a moment earlier.
        return (
            self.agents.of(snap.doc).is_quick(phase)
            and not change.check_inbox
            and change.phase in WORK_PHASES
            and self._inline(Phase(change.phase), snap)
        )

    def _flush(self, held: _Held) -> None:
        """Write the commits held back (before a read that must see them, or at the end)."""
        if held.staged:
            pending = [staged for _, staged in held.staged]
            self.services.sessions.flush(pending, self._still_held(held))
            self._applied(held)

    def _applied(self, held: _Held, phase: Phase | None = None) -> None:
        held.outcome.phases.extend(staged_phase for staged_phase, _ in held.staged)
        held.staged.clear()
        if phase is not None:
            held.outcome.phases.append(phase)
        held.outcome.status = "applied"

    def _still_held(self, held: _Held) -> Callable[[], bool] | None:
        handle = held.handle
        return None if handle is None else partial(self.services.sync.surely_held, handle)

    def _given_up(self, snap: Snapshot) -> str | None:
        """Why the turn must end without its handler: its revision was recovered (its
        worker lost, by the broker or the sweep) more than AGENTSTATE_MAX_RECOVERIES times,
        so the handler is likely what kills its workers. (Only a snapshot read from the
        database knows the count; a cached one says 0, and the sweep has its own check.)"""
        if snap.recoveries <= self.services.settings.max_recoveries:
            return None
        return f"gave up after {snap.recoveries - 1} recoveries in phase {snap.phase}"

    def _limit_outlasts_lease(self) -> bool:
        # A quick handler's lock is not renewed: fine while its time limit ends before
        # the lock could expire unseen, else renew it like any other.
        settings = self.services.settings
        return settings.phase_time_limit >= settings.lock_timeout / 2

    def _lock_wait_s(self, phase: Phase) -> float:
        # A kick only needs to know the session is busy; a phase waits a while for a
        # quick holder, then the task retries later instead of blocking a worker.
        limit = KICK_LOCK_WAIT_S if phase == Phase.UNDERSTANDING else PHASE_LOCK_WAIT_S
        return min(limit, self.services.settings.lock_timeout)

    def _mid_turn(self, session_id: str) -> bool:
        snap = self.services.sessions.load_from_database(session_id)
        return snap is not None and snap.phase not in RESTING_PHASES

    def _from_entry(self, delivery: Delivery, entry: CachedEntry | None) -> Snapshot | None:
        if entry is None or delivery.revision is None or entry[0] != delivery.revision:
            return None
        return self.services.sessions.cached_from_entry(delivery.session_id, entry)

    def _load(self, delivery: Delivery, first: Snapshot | None) -> tuple[Snapshot | None, bool]:
        """The snapshot to work on, and whether it came from the cache."""
        if first is not None:
            return first, True
        return self.services.sessions.load_from_database(delivery.session_id), False

    def _due(self, delivery: Delivery, snap: Snapshot) -> bool:
        if delivery.phase == Phase.UNDERSTANDING:
            # Starting a turn is due whenever the session rests (a queued message is
            # checked next); the revision a kick carries only picks the cached copy.
            return snap.phase in RESTING_PHASES
        expected = delivery.revision
        return snap.phase == delivery.phase and (expected is None or snap.revision == expected)

    def _inline(self, phase: Phase, snap: Snapshot) -> bool:
        # The session's own agent decides (a session's agent never changes).
        return self.services.inline and self.agents.of(snap.doc).is_quick(phase)

    # -- building a phase's change ---------------------------------------------

    def _draft(
        self,
        phase: Phase,
        snap: Snapshot,
        task_id: str | None,
        give_up: str | None,
        held: _Held,
    ) -> Draft | None:
        draft = Draft(snap, task_id)
        draft.before_read = partial(self._flush, held)
        draft.held_back = [staged for _, staged in held.staged]
        if phase == Phase.UNDERSTANDING:
            item = self.services.inbox.next_queued(snap.session_id)
            if item is None:
                return None
            rules.start_turn(draft, item)
        elif phase == Phase.EXECUTING and self.services.waiting_on_workflow(snap):
            return None
        draft.checkpoint()
        if give_up is not None:
            rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, give_up)
        elif deadline_passed(draft.snap, self.services.deadline_grace(draft.snap)):
            rules.fail_turn(draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, rules.DEADLINE_PASSED)
        else:
            self.handlers.handle(phase, draft)
        return draft
