"""The recovery sweep: finds work whose task was lost and enqueues it again.

"Assume state can be lost at any time; fast recovery matters more than preventing loss."
Everything the sweep re-enqueues carries the revision it expects, so re-enqueueing work
that is in fact still running is harmless: the revision guard drops the loser.

Only work a worker took and lost counts toward AGENTSTATE_MAX_RECOVERIES; past it, the
work is poison: the turn ends with an apology, the step fails, and the reason is recorded.
A phase that kills its worker is delivered again by the broker (flagged redelivered), and
the turn engine counts that; a step whose claim's lease ran out is counted here, unless
the sweep already sent it again at that revision and no worker claimed it since (then it
merely waits in the queue). Work that merely waits is never given up, however long the
queue, and is not re-sent while the broker still holds its message: work last sent after
the oldest message still queued (Dispatcher.oldest_queued) is left alone. Where the broker
cannot tell (RabbitMQ), the re-sends back off (STUCK_AFTER, then 2x, 4x, ... 16x), so a
backlog is not multiplied by its own re-sends. Each sweep also releases the steps parked
for their owner's fair share that have room (state.workflows.fairshare).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

import redis

from state import observe
from state.clock import utcnow
from state.errors import AgentStateError
from state.machine import RESTING_PHASES, WAITING_PHASES, Phase, Trigger
from state.recovery.queries import (
    note_session_recovery,
    note_step_recovery,
    overdue_steps,
    sessions_waiting_in_inbox,
    stuck_sessions,
    stuck_steps,
)
from state.sessions.snapshot import Snapshot
from state.storage import keys
from state.turns.deadlines import deadline_passed
from state.turns.interventions import TurnInterventions
from state.turns.rules import ERROR_REPLY
from state.turns.services import TurnServices
from state.workflow import WorkflowStepStatus
from state.workflows.engine import WorkflowEngine

logger = logging.getLogger(__name__)

BATCH = 500
# Clocks of the processes that send messages and write rows may differ a little: work
# sent this long before the oldest queued message may still be queued.
QUEUED_MARGIN_S = 1.0
# What a sweep did that took lost or stuck work up again (the rest of its report is what
# it found and left: busy sessions, errors).
RECOVERIES = (
    "sessions_resumed",
    "turns_started",
    "sessions_poisoned",
    "steps_redispatched",
    "steps_poisoned",
    "timed_out",
    "steps_timed_out",
)


@dataclass
class SweepReport:
    """What one sweep found and did."""

    sessions_resumed: int = 0
    turns_started: int = 0
    sessions_poisoned: int = 0
    steps_redispatched: int = 0
    steps_released: int = 0
    steps_poisoned: int = 0
    timed_out: int = 0
    steps_timed_out: int = 0
    skipped_busy: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-ready form."""
        return asdict(self)


class RecoverySweep:
    """One pass over sessions and steps that stopped making progress."""

    def __init__(
        self, services: TurnServices, turns: TurnInterventions, workflows: WorkflowEngine
    ) -> None:
        self.services = services
        self.turns = turns
        self.workflows = workflows
        self.settings = services.settings

    def run(self) -> SweepReport:
        """Sweep once (skipped if another sweep holds the sweep lock)."""
        report = SweepReport()
        lock = self._sweep_lock()
        if lock is False:
            logger.info("another recovery sweep is running; skipping this one")
            return report
        try:
            cutoff = utcnow() - timedelta(seconds=self.settings.stuck_after)
            turns_sent, steps_sent = self._queued_since(False), self._queued_since(True)
            self._sessions(cutoff if turns_sent is None else min(cutoff, turns_sent), report)
            self._inboxes(cutoff, report, turns_sent)
            self._steps(cutoff, report, steps_sent)
            self._overdue_steps(report)
            report.steps_released += len(self.workflows.share.release_all())
        finally:
            self._release_sweep_lock(lock)
        counts = report.as_dict()
        observe.current.swept(counts, sum(counts[what] for what in RECOVERIES))
        if any(counts.values()):
            logger.warning("recovery sweep: %s", counts)
        return report

    def _queued_since(self, steps: bool) -> datetime | None:
        """Work sent after this may still wait in the broker's queue (its oldest message
        was sent then, less a margin for clocks): only work sent before it may be lost.
        None: the queue is empty, or the broker cannot tell (then the re-sends of merely
        waiting work back off, as before)."""
        sent = self.services.dispatcher.oldest_queued(steps)
        if sent is None:
            return None
        return datetime.fromtimestamp(sent - QUEUED_MARGIN_S, UTC)

    def _each(self, report: SweepReport, what: str, item: str, act: Callable[[], None]) -> None:
        # One bad item (a document from newer code, a race lost to a live worker) must
        # not stop the sweep from reaching everything behind it.
        try:
            act()
        except AgentStateError as exc:
            report.errors += 1
            logger.warning("recovery sweep: %s %s skipped: %s", what, item, exc)

    def _sessions(self, cutoff: datetime, report: SweepReport) -> None:
        for session_id in stuck_sessions(self.services.sessions.engine, cutoff, BATCH):
            act = partial(self._session, session_id, report)
            self._each(report, "session", session_id, act)

    def _session(self, session_id: str, report: SweepReport) -> None:
        snap = self.services.sessions.load_from_database(session_id)
        if snap is None or snap.phase in WAITING_PHASES:
            return
        if deadline_passed(snap):
            # Even if a live worker holds the lock: its handler overran.
            self.turns.fire_timeout(session_id, snap.deadline_at or 0.0)
            report.timed_out += 1
            return
        if self.services.sync.current_holder(session_id) is not None:
            report.skipped_busy += 1  # a live worker holds (and renews) its lock
            return
        if snap.phase == Phase.EXECUTING and self.services.waiting_on_workflow(snap):
            return  # the workflow's steps are recovered on their own
        self._recover_session(snap, report)

    def _recover_session(self, snap: Snapshot, report: SweepReport) -> None:
        # Not counted: its phase may only be waiting in the queue (a lost worker's phase
        # is counted when the broker delivers it again); what the redeliveries counted
        # still gives the turn up.
        count = note_session_recovery(
            self.services.sessions.engine,
            snap,
            count=False,
            resend_after=self.settings.stuck_after,
        )
        if count is None:
            return  # it moved on meanwhile
        if count > self.settings.max_recoveries:
            cause = f"gave up after {count - 1} recoveries in phase {snap.phase}"
            self.turns.break_turn(snap, Trigger.ERROR_OCCURRED, ERROR_REPLY, cause)
            report.sessions_poisoned += 1
            return
        moved = self.services.sessions.load_from_database(snap.session_id)
        if moved is not None:
            self.turns.resume(moved)
            report.sessions_resumed += 1

    def _inboxes(self, cutoff: datetime, report: SweepReport, sent: datetime | None) -> None:
        engine = self.services.sessions.engine
        for session_id in sessions_waiting_in_inbox(engine, cutoff, BATCH, sent):
            act = partial(self._inbox, session_id, report)
            self._each(report, "inbox of", session_id, act)

    def _inbox(self, session_id: str, report: SweepReport) -> None:
        snap = self.services.sessions.load_from_database(session_id)
        if snap is None or snap.phase not in RESTING_PHASES:
            return  # mid-turn: the turn picks the message up when it ends
        if self.services.sync.current_holder(session_id) is not None:
            report.skipped_busy += 1
            return
        count = note_session_recovery(
            self.services.sessions.engine,
            snap,
            count=False,
            resend_after=self.settings.stuck_after,
        )
        if count is None:
            return  # it moved on meanwhile
        if count > self.settings.max_recoveries:
            self.turns.reject_next_message(snap, f"gave up after {count - 1} attempts")
            report.sessions_poisoned += 1
            return
        self.services.dispatcher.phase(Phase.UNDERSTANDING, session_id, None)
        report.turns_started += 1

    def _steps(self, cutoff: datetime, report: SweepReport, sent: datetime | None) -> None:
        engine = self.workflows.store.engine
        for workflow_id, step_id, revision, status in stuck_steps(engine, cutoff, BATCH, sent):
            lost = status == WorkflowStepStatus.RUNNING
            act = partial(self._step, workflow_id, step_id, revision, lost, report)
            self._each(report, "step", f"{workflow_id}/{step_id}", act)

    def _step(
        self, workflow_id: str, step_id: str, revision: int, lost: bool, report: SweepReport
    ) -> None:
        # Only a running step whose lease expired is evidence of a lost worker; ready
        # steps may just be waiting in a long queue and are re-sent without counting.
        count = note_step_recovery(
            self.workflows.store.engine,
            workflow_id,
            step_id,
            revision,
            count=lost,
            lease_s=self.settings.stuck_after,
        )
        if count is None:
            return
        if lost and count > self.settings.max_recoveries:
            reason = f"worker lost {count - 1} times; gave up"
            self.workflows.follow(
                self.workflows.store.abandon(workflow_id, step_id, revision, reason)
            )
            report.steps_poisoned += 1
            return
        self.workflows.dispatcher.step(workflow_id, step_id, revision)
        report.steps_redispatched += 1

    def _overdue_steps(self, report: SweepReport) -> None:
        # A step past its timeout_s whose worker is stuck or gone: a failed attempt, like
        # the one its own worker's alarm would have counted.
        for workflow_id, step_id, revision in overdue_steps(self.workflows.store.engine, BATCH):
            act = partial(self._expire_step, workflow_id, step_id, revision, report)
            self._each(report, "overdue step", f"{workflow_id}/{step_id}", act)

    def _expire_step(
        self, workflow_id: str, step_id: str, revision: int, report: SweepReport
    ) -> None:
        self.workflows.expire(workflow_id, step_id, revision)
        report.steps_timed_out += 1

    def _sweep_lock(self) -> str | bool | None:
        token = utcnow().isoformat()
        ttl_ms = int(max(self.settings.sweep_interval, 30.0) * 1000)
        try:
            acquired = self.services.sync.redis.set(keys.sweep_lock(), token, nx=True, px=ttl_ms)
        except redis.RedisError:
            return None  # without Redis, sweep anyway: every action is revision-guarded
        return token if acquired else False

    def _release_sweep_lock(self, token: str | bool | None) -> None:
        if isinstance(token, str):
            self.services.sync.release_key(keys.sweep_lock(), token)
