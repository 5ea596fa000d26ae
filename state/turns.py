"""The turn engine: runs one phase of one session, exactly once, then hands over.

A phase run is: lock the session (one Redis round trip that also reads the cache) ->
check that this delivery is for the version the session is at (else it is a duplicate
and is dropped) -> call the agent's handler -> fire the trigger on the FSM -> commit the
handler's changes with the version bump in one transaction (guarded, lock checked) ->
write the cache and release the lock (one round trip) -> enqueue the next phase.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import redis
from sqlalchemy.exc import InterfaceError, OperationalError

from config import HopPolicy
from state import keys, users
from state.agent import Agent, PhaseContext, PhaseResult
from state.backend import Backend
from state.dispatch import Dispatcher
from state.errors import InvalidTransitionError, StaleStateError, StateLockAcquisitionError
from state.lock import DistributedStateSync, LockHandle
from state.machine import RESTING_STATES, WORK_PHASES
from state.session import make_message, utcnow
from state.session_store import CommitResult, InboxItem, SessionStore, Snapshot
from state.store import PersistentStateManager
from state.ticker import Ticker
from state.turn_draft import Draft, Followups, PhaseOutcome
from state.workflow import parse_spec
from state.workflow_store import WorkflowStore

# The per-phase values live in state.turn_draft; they are re-exported here for importers.
__all__ = [
    "DEFAULT_REPLY",
    "ERROR_REPLY",
    "KICK_LOCK_WAIT_S",
    "MAX_EXECUTION_ATTEMPTS",
    "PHASE_LOCK_WAIT_S",
    "TIMEOUT_REPLY",
    "Document",
    "Draft",
    "Followups",
    "PhaseOutcome",
    "TurnEngine",
]

logger = logging.getLogger(__name__)

Document = dict[str, Any]
_alarms = Ticker("deadline-alarms")
# A lost race, or the store failing: the task drops or retries these; they say nothing
# about the handler's result.
NOT_ABOUT_THE_RESULT: tuple[type[Exception], ...] = (
    StaleStateError,
    StateLockAcquisitionError,
    OperationalError,
    InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
)
MAX_EXECUTION_ATTEMPTS = 3
KICK_LOCK_WAIT_S = 0.5
PHASE_LOCK_WAIT_S = 5.0
ERROR_REPLY = "Sorry, something went wrong while I worked on that. Please try again."
TIMEOUT_REPLY = "Sorry, that took too long and I had to stop. Please try again."
DEFAULT_REPLY = "(the agent gave no reply)"
_FINISHED_WORKFLOW = frozenset({"success", "failed"})


class TurnEngine:
    """Runs phases of sessions against the store, the lock and the agent."""

    def __init__(
        self,
        backend: Backend,
        agent: Agent,
        dispatcher: Dispatcher,
        known_actions: Callable[[], Iterable[str]],
    ) -> None:
        self.settings = backend.settings
        self.agent = agent
        self.dispatcher = dispatcher
        self.known_actions = known_actions
        self.sessions = SessionStore(backend.engine, backend.cache)
        self.sync = DistributedStateSync(backend.redis, self.sessions, settings=self.settings)
        self.users = PersistentStateManager(backend.redis, backend.engine, settings=self.settings)
        self.workflows = WorkflowStore(backend.engine)
        self.cache = backend.cache

    # -- one phase task --------------------------------------------------------

    def run_phase(
        self,
        phase: str,
        session_id: str,
        expected_version: int | None,
        task_id: str | None = None,
        *,
        use_cache: bool = True,
    ) -> PhaseOutcome:
        """Run ``phase`` (and, under the inline policy, the quick phases after it).

        A retried or redelivered task passes ``use_cache=False``: its own commit may have
        landed unseen, and only the database can tell before the handler runs again.
        """
        try:
            handle, entry = self.sync.acquire(
                session_id, read_cache=True, timeout_s=self._lock_wait_s(phase)
            )
        except StateLockAcquisitionError:
            if phase == "understanding" and self._mid_turn(session_id):
                # The running turn takes the next message from the inbox when it ends.
                return PhaseOutcome(session_id, "busy")
            raise
        published = False
        try:
            followups = Followups()
            held = (handle, entry if use_cache else None, followups)
            outcome, snap = self._run_locked(phase, session_id, expected_version, task_id, held)
            if snap is None:
                return outcome
            self.sync.publish_and_release(handle, snap)
            published = True
            self._send(snap.session_id, followups)
            outcome.version = snap.version
            return outcome
        finally:
            if not published:
                self.sync.release(handle)

    def _run_locked(
        self,
        phase: str,
        session_id: str,
        expected: int | None,
        task_id: str | None,
        held: tuple[LockHandle, tuple[int, Document] | None, Followups],
    ) -> tuple[PhaseOutcome, Snapshot | None]:
        handle, entry, followups = held
        for cached_entry in (entry, None):
            snap, from_cache = self._load(session_id, expected, cached_entry)
            if snap is None:
                return PhaseOutcome(session_id, "unknown-session"), None
            if not self._due(phase, snap, expected):
                if task_id is not None and snap.last_task_id == task_id:
                    self.resume(snap)  # our commit landed but its follow-ups may not have
                return PhaseOutcome(session_id, "duplicate", version=snap.version), None
            if not self.agent.is_quick(phase):
                self.sync.keep_renewed(handle)
            outcome = PhaseOutcome(session_id, "nothing-to-do", version=snap.version)
            try:
                return outcome, self._run_phases(phase, snap, handle, task_id, (followups, outcome))
            except StaleStateError:
                if not from_cache or outcome.phases:
                    raise
                # The cached copy was behind: its writer died between commit and cache
                # write. Nothing was applied; look at the database and try once more.
        raise AssertionError("unreachable")

    def _run_phases(
        self,
        phase: str | None,
        snap: Snapshot,
        handle: LockHandle,
        task_id: str | None,
        report: tuple[Followups, PhaseOutcome],
    ) -> Snapshot:
        followups, outcome = report
        while phase is not None:
            draft = self._draft(phase, snap, task_id)
            if draft is None:
                break
            result = self._commit(snap, draft, handle)
            snap = result.snapshot
            outcome.phases.append(phase)
            outcome.status = "applied"
            self._after_commit(draft, followups)
            phase = self._next_phase(snap, result.queued)
            if phase is not None and not self._inline(phase):
                followups.phase = (phase, snap.version)
                phase = None
        return snap

    def _commit(self, snap: Snapshot, draft: Draft, handle: LockHandle) -> CommitResult:
        still_held = partial(self.sync.surely_held, handle)
        try:
            return self.sessions.commit(snap, draft.change(), still_held)
        except NOT_ABOUT_THE_RESULT:
            raise
        except Exception as exc:
            # The handler's result cannot be stored (a user-state change that raises, a
            # workflow id already taken, ...): end the turn now instead of retrying.
            logger.warning(
                "session %s: result of %s not storable: %r", snap.session_id, snap.phase, exc
            )
            self._fail_turn(draft, "error_occurred", ERROR_REPLY, f"{type(exc).__name__}: {exc}")
            return self.sessions.commit(snap, draft.change(), still_held)

    def _lock_wait_s(self, phase: str) -> float:
        # A kick only needs to know the session is busy; a phase waits a while for a
        # quick holder, then the task retries later instead of blocking a worker.
        limit = KICK_LOCK_WAIT_S if phase == "understanding" else PHASE_LOCK_WAIT_S
        return min(limit, self.settings.lock_timeout)

    def _mid_turn(self, session_id: str) -> bool:
        snap = self.sessions.load_from_database(session_id)
        return snap is not None and snap.phase not in RESTING_STATES

    def _load(
        self, session_id: str, expected: int | None, entry: tuple[int, Document] | None
    ) -> tuple[Snapshot | None, bool]:
        """The snapshot to work on, and whether it came from the cache."""
        if entry is not None and expected is not None and entry[0] == expected:
            cached = self.sessions.cached_from_entry(session_id, entry)
            if cached is not None:
                return cached, True
        return self.sessions.load_from_database(session_id), False

    def _due(self, phase: str, snap: Snapshot, expected: int | None) -> bool:
        if phase == "understanding":
            # Starting a turn is due whenever the session rests (a queued message is
            # checked next); the version a kick carries only picks the cached copy.
            return snap.phase in RESTING_STATES
        return snap.phase == phase and (expected is None or snap.version == expected)

    def _inline(self, phase: str) -> bool:
        return self.settings.hop_policy == HopPolicy.INLINE and self.agent.is_quick(phase)

    def _next_phase(self, snap: Snapshot, queued: bool) -> str | None:
        if snap.phase in RESTING_STATES:
            return "understanding" if queued else None
        if snap.phase == "executing" and self.waiting_on_workflow(snap):
            return None
        return snap.phase if snap.phase in WORK_PHASES else None

    # -- building a phase's change ---------------------------------------------

    def _draft(self, phase: str, snap: Snapshot, task_id: str | None) -> Draft | None:
        draft = Draft(snap, task_id)
        if phase == "understanding":
            item = self.sessions.next_queued(snap.session_id)
            if item is None:
                return None
            self._start_turn(draft, item)
        elif phase == "executing" and self.waiting_on_workflow(snap):
            return None
        draft.checkpoint()
        if self.deadline_passed(draft.snap):
            self._fail_turn(draft, "timeout", TIMEOUT_REPLY, "execution deadline passed")
            return draft
        try:
            with self._alarm(draft):
                result = self.agent.run(phase, self._context(phase, draft))
            self._apply(phase, draft, result)
            draft.check_storable()
        except StaleStateError:
            raise
        except Exception as exc:
            logger.warning("session %s: %s handler failed: %r", snap.session_id, phase, exc)
            self._fail_turn(draft, "error_occurred", ERROR_REPLY, f"{type(exc).__name__}: {exc}")
            return draft
        if self.deadline_passed(draft.snap):
            # The handler overran: its result arrives too late to count.
            self._fail_turn(draft, "timeout", TIMEOUT_REPLY, "execution deadline passed")
        return draft

    def _start_turn(self, draft: Draft, item: InboxItem) -> None:
        trigger = "receive_input" if draft.phase == "idle" else "user_responded"
        draft.metadata["turn"] = {
            "message_id": item.message_id,
            "started_at": utcnow().isoformat(),
            "path": [draft.phase],
        }
        draft.fire(trigger)
        draft.context = {"message": item.text, "message_id": item.message_id, "attempt": 1}
        for key in ("tool_results", "pending_actions", "active_tools"):
            draft.doc[key] = []
        draft.messages.append(make_message("user", item.text, {"message_id": item.message_id}))
        draft.inbox[item.message_id] = "started"

    def _context(self, phase: str, draft: Draft) -> PhaseContext:
        snap = draft.snap
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
            workflow=self._finished_workflow(draft) if phase == "executing" else None,
            attempt=int(draft.context.get("attempt", 1)),
            history_reader=lambda n: self.sessions.history(snap.session_id, last=n),
            user_state_reader=lambda: self.users.load_user_state(snap.user_id),
        )

    def _apply(self, phase: str, draft: Draft, result: PhaseResult) -> None:
        draft.context.update(result.context)
        draft.metadata.update(result.metadata)
        for key in ("tool_results", "pending_actions", "active_tools"):
            value = getattr(result, key)
            if value is not None:
                draft.doc[key] = value
        if result.user_state is not None:
            self._change_user_state(draft, result.user_state)
        if result.trigger is None:
            self._wait_for_workflow(phase, draft, result.workflow)
            return
        if result.trigger == "retry_needed":
            self._count_attempt(draft)
        draft.fire(result.trigger)
        self._on_enter(draft, result)

    def _on_enter(self, draft: Draft, result: PhaseResult) -> None:
        if draft.phase == "executing":
            draft.deadline = time.time() + self.settings.execution_timeout
        elif draft.snap.phase == "executing":
            draft.deadline = None
        if draft.phase == "clarifying":
            draft.reply(result.reply or "Could you tell me a little more?", kind="clarification")
        elif draft.phase == "idle":
            draft.reply(result.reply or DEFAULT_REPLY)
        elif draft.phase in ("error", "timeout"):
            self._recover(draft, result.reply)

    def _count_attempt(self, draft: Draft) -> None:
        attempt = int(draft.context.get("attempt", 1)) + 1
        if attempt > MAX_EXECUTION_ATTEMPTS:
            raise InvalidTransitionError(f"gave up after {MAX_EXECUTION_ATTEMPTS} attempts")
        draft.context["attempt"] = attempt

    def _wait_for_workflow(self, phase: str, draft: Draft, spec: Document | None) -> None:
        if phase != "executing" or spec is None:
            raise InvalidTransitionError(
                f"{phase} returned no trigger; only executing may wait, and only for a workflow"
            )
        wf = parse_spec({**spec, "session_id": draft.snap.session_id}, self.known_actions())
        resume_version = draft.snap.version + 1

        def create(conn: Any) -> None:
            for step_id, version in self.workflows.create_in(conn, wf, resume_version):
                draft.roots.append((wf.workflow_id, step_id, version))

        draft.ops.append(create)
        draft.context["workflow_id"] = wf.workflow_id
        draft.metadata["workflows"] = [*draft.metadata.get("workflows", []), wf.workflow_id][-20:]

    def _change_user_state(self, draft: Draft, change: Callable[[Document], Document]) -> None:
        user_id = draft.snap.user_id

        def write(conn: Any) -> None:
            doc, revision = users.mutate(conn, user_id, change)
            draft.user_writes.append((user_id, revision, doc))

        draft.ops.append(write)

    def _fail_turn(self, draft: Draft, trigger: str | None, reply: str, cause: str) -> None:
        draft.rollback()
        failed_in = draft.phase  # a turn's first phase: the snapshot still says idle
        if trigger is not None:
            draft.fire(trigger)
        draft.metadata["last_error"] = {
            "cause": "timeout" if trigger == "timeout" else "error",
            "detail": cause[:500],
            "phase": failed_in,
            "at": utcnow().isoformat(),
        }
        self._recover(draft, reply)

    def _recover(self, draft: Draft, reply: str | None) -> None:
        draft.fire("reset")
        draft.deadline = None
        draft.reply(reply or ERROR_REPLY, kind="apology")

    # -- after a commit --------------------------------------------------------

    def _after_commit(self, draft: Draft, followups: Followups) -> None:
        followups.steps.extend(draft.roots)
        followups.user_cache.extend(draft.user_writes)
        if draft.phase == "executing" and draft.roots:
            # Waiting on a workflow: an in-process alarm rings the deadline check (see
            # _alarm). A countdown task would outlive a workflow that finishes first and
            # sit in the broker until the deadline; if this process dies, the recovery
            # sweep enforces the stored deadline.
            followups.deadline = draft.deadline

    def _send(self, session_id: str, followups: Followups) -> None:
        for user_id, revision, doc in followups.user_cache:
            self.cache.put(keys.user_state_cache(user_id), revision, doc)
        for workflow_id, step_id, version in followups.steps:
            self.dispatcher.step(workflow_id, step_id, version)
        if followups.deadline is not None:
            self._ring_at(session_id, followups.deadline)
        if followups.phase is not None:
            self.dispatcher.phase(followups.phase[0], session_id, followups.phase[1])

    # -- workflows and deadlines -----------------------------------------------

    @contextmanager
    def _alarm(self, draft: Draft) -> Iterator[None]:
        """While an executing handler runs, enqueue the deadline check when it is due.

        Scheduling a countdown task for every turn would park one message per turn in a
        worker's memory for the whole timeout; most handlers finish long before it. If
        this worker dies instead, the recovery sweep checks the stored deadline.
        """
        deadline = draft.snap.deadline_at
        if draft.snap.phase != "executing" or deadline is None:
            yield
            return
        key = self._ring_at(draft.snap.session_id, deadline)
        try:
            yield
        finally:
            _alarms.unregister(key)

    def _ring_at(self, session_id: str, deadline: float) -> str:
        """Enqueue the deadline check when ``deadline`` comes; return the alarm's key (a
        later executing run of the same turn replaces, then removes, the same alarm)."""
        key = f"deadline:{session_id}:{deadline}"

        def ring() -> bool:
            self.dispatcher.timeout(session_id, deadline, 0.0)
            return False  # once

        _alarms.register(key, max(0.0, deadline - time.time()), ring)
        return key

    def waiting_on_workflow(self, snap: Snapshot) -> bool:
        workflow_id = (snap.doc.get("context_window") or {}).get("workflow_id")
        if not workflow_id:
            return False
        status = self.workflows.status(workflow_id)
        return status is not None and status not in _FINISHED_WORKFLOW

    def _finished_workflow(self, draft: Draft) -> Document | None:
        workflow_id = draft.context.get("workflow_id")
        return self.workflows.document(workflow_id) if workflow_id else None

    def deadline_passed(self, snap: Snapshot) -> bool:
        """Whether the session is executing past its stored deadline."""
        deadline = snap.deadline_at
        return snap.phase == "executing" and deadline is not None and time.time() > deadline

    # -- the durable execution timeout and recovery ----------------------------

    def fire_timeout(self, session_id: str, deadline: float) -> PhaseOutcome:
        """Time the session out if it is still executing under ``deadline``."""
        outcome = PhaseOutcome(session_id, "not-due")
        snap = self.sessions.load_from_database(session_id)
        if snap is None or snap.phase != "executing" or snap.deadline_at != deadline:
            return outcome
        if time.time() < deadline:
            self.dispatcher.timeout(session_id, deadline, deadline - time.time())
            return outcome
        return self.break_turn(snap, "timeout", TIMEOUT_REPLY, "execution deadline passed")

    def break_turn(
        self, snap: Snapshot, trigger: str | None, reply: str, cause: str
    ) -> PhaseOutcome:
        """End a turn that its worker cannot finish, with an apology and the cause kept."""
        draft = Draft(snap, None)
        self._fail_turn(draft, trigger, reply, cause)
        return self._force_commit(snap, draft, trigger or "reset")

    def reject_next_message(self, snap: Snapshot, cause: str) -> PhaseOutcome:
        """Answer the next queued message with an apology without running its turn."""
        item = self.sessions.next_queued(snap.session_id)
        if item is None or snap.phase not in RESTING_STATES:
            return PhaseOutcome(snap.session_id, "nothing-to-do")
        draft = Draft(snap, None)
        self._start_turn(draft, item)
        self._fail_turn(draft, "error_occurred", ERROR_REPLY, cause)
        return self._force_commit(snap, draft, "rejected")

    def _force_commit(self, snap: Snapshot, draft: Draft, status: str) -> PhaseOutcome:
        # Commits without waiting for the lock: the worker that still holds it will find
        # the version moved and its write refused. Its lock is freed here only if it is
        # still that worker's.
        holder = self.sync.current_holder(snap.session_id)
        result = self.sessions.commit(snap, draft.change())
        if holder is not None:
            self.sync.release_state_lock(snap.session_id, holder)
        self.sessions.publish(result.snapshot)
        followups = Followups()
        if result.queued:
            followups.phase = ("understanding", result.snapshot.version)
        self._send(snap.session_id, followups)
        return PhaseOutcome(snap.session_id, status, [snap.phase], result.snapshot.version)

    def resume(self, snap: Snapshot) -> str | None:
        """Re-enqueue whatever the persisted state says comes next; return what it was."""
        if snap.phase in ("error", "timeout"):
            self.break_turn(snap, None, ERROR_REPLY, f"found in {snap.phase}")
            return "reset"
        if snap.phase == "executing" and self.deadline_passed(snap):
            self.fire_timeout(snap.session_id, snap.deadline_at or 0.0)
            return "timeout"
        queued = snap.phase in RESTING_STATES and self.sessions.queued_count(snap.session_id) > 0
        phase = self._next_phase(snap, queued)
        if phase is not None:
            self.dispatcher.phase(phase, snap.session_id, snap.version)
        return phase
