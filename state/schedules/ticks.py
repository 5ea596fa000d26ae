"""Firing due ticks: each tick is one guarded row, committed with what it does.

A look for due ticks locks the schedules whose ``next_tick`` has come (``FOR UPDATE SKIP
LOCKED``: two beats, or a beat and a worker, take different schedules and never wait for
each other) and, for each, in one transaction:

1. inserts the tick's row in ``schedule_runs`` (its key is (schedule_id, tick): a tick that
   has a row never fires again);
2. accepts the message (idempotency key ``{schedule_id}:{tick}``) or stores the workflow
   (id ``{schedule_id}:{tick}``), unless the run before is still going and the schedule's
   ``overlap`` is ``skip``; a target that refuses (a full inbox, a session of another user,
   a quota) makes the tick ``skipped`` with the reason, in a savepoint;
3. writes ``schedule.fired`` to the outbox, and moves ``next_tick`` on.

A tick late by less than AGENTSTATE_SCHEDULE_GRACE (a busy beat, a killed worker) is only
late: it fires, and every tick after it that is due too, each its own row. Later than that,
beat was down: ``catch_up="latest"`` fires the most recent tick once, ``"none"`` only the
ticks still within the grace.

Only after the commit are the turn kicked and the workflow's roots sent; a process killed
in between leaves a queued message or unsent ready steps, which the recovery sweep sends.
A process killed before the commit leaves the tick due, and the next look fires it. So the
function may be called from anywhere (a beat task, a worker), as often as one likes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, false, select, update

from config import Settings
from state.clock import as_utc, utcnow
from state.dispatch import Dispatcher
from state.documents import codec
from state.documents.codec import Document
from state.errors import BadInputError
from state.events import log
from state.machine import Phase
from state.schedules.spec import CatchUp, Overlap, RunStatus
from state.schedules.timing import Timing, tick_text
from state.sessions.inbox import Inbox
from state.sessions.snapshot import InboxState
from state.storage.db import dialect_insert
from state.storage.tables import inbox, workflows
from state.storage.tables_automation import schedule_runs, schedules
from state.webhooks.outbox import WebhookEvent, enqueue
from state.workflow import WorkflowState, WorkflowStatus
from state.workflows.creation import insert_workflow
from state.workflows.records import Dispatch
from state.workflows.spec import SpecLimits, parse_spec

logger = logging.getLogger(__name__)

BATCH = 100
# Ticks of one schedule fired by one look when it is behind (within the grace).
MAX_TICKS_PER_LOOK = 100
STILL_GOING = "the run of the tick before is still going"


@dataclass(frozen=True)
class TickRules:
    """What firing needs from the settings."""

    grace_s: float  # AGENTSTATE_SCHEDULE_GRACE: how late a catch_up="none" tick may fire
    approval_ttl_s: float
    max_pending_approvals: int | None
    limits: SpecLimits
    max_queued: int | None = None  # AGENTSTATE_MAX_QUEUED_MESSAGES: a full inbox skips a tick

    @classmethod
    def from_settings(cls, settings: Settings) -> TickRules:
        """The rules ``settings`` sets."""
        return cls(
            settings.schedule_grace,
            settings.approval_ttl,
            settings.max_pending_approvals,
            SpecLimits.from_settings(settings),
            settings.max_queued_messages,
        )


@dataclass
class TickReport:
    """What one look did, and what it leaves to send after its commits."""

    fired: int = 0
    skipped: int = 0
    missed: int = 0
    taken: int = 0  # schedules looked at
    # Seconds from each fired tick to its commit (how late beat fired it).
    delays: list[float] = field(default_factory=list)
    kicks: list[tuple[str, int | None]] = field(default_factory=list)
    started: list[tuple[WorkflowState, list[Dispatch]]] = field(default_factory=list)

    def count(self, status: str, tick: datetime) -> None:
        """One tick fired or skipped."""
        if status == RunStatus.FIRED:
            self.fired += 1
            self.delays.append(max(0.0, (utcnow() - tick).total_seconds()))
        else:
            self.skipped += 1

    def as_dict(self) -> Document:
        """The counts, JSON-ready (a task's result)."""
        return {"fired": self.fired, "skipped": self.skipped, "missed": self.missed}


class ScheduleClock:
    """Fires due ticks (see the module docstring)."""

    def __init__(self, engine: Engine, rules: TickRules) -> None:
        self.engine = engine
        self.rules = rules
        self.inbox = Inbox(engine, rules.max_queued)

    def fire_due(self, now: datetime | None = None, batch: int = BATCH) -> TickReport:
        """One transaction: up to ``batch`` due schedules that nobody else holds."""
        now = now or utcnow()
        report = TickReport()
        with self.engine.begin() as conn:
            due = conn.execute(
                select(schedules)
                .where(schedules.c.paused == false(), schedules.c.next_tick <= now)
                .order_by(schedules.c.next_tick)
                .limit(batch)
                .with_for_update(skip_locked=True)
            ).all()
            report.taken = len(due)
            for row in due:
                self._fire(conn, row._mapping, now, report)
        return report

    def run(
        self, dispatcher: Dispatcher, send_roots: SendRoots, budget_s: float = 5.0
    ) -> TickReport:
        """Look until nothing is due (or ``budget_s`` has passed), sending each batch's
        kicks and workflow roots after its commit."""
        total = TickReport()
        deadline = time.monotonic() + budget_s
        while True:
            report = self.fire_due()
            follow_up(report, dispatcher, send_roots)
            total.fired += report.fired
            total.skipped += report.skipped
            total.missed += report.missed
            total.delays += report.delays
            if report.taken < BATCH:
                return total
            if time.monotonic() > deadline:
                return total

    def _fire(
        self, conn: Connection, row: Mapping[Any, Any], now: datetime, report: TickReport
    ) -> None:
        timing = Timing(row["cron"], row["every_seconds"], row["timezone"])
        tick: datetime | None = self._first(timing, row, as_utc(row["next_tick"]), now, report)
        last = None
        for _ in range(MAX_TICKS_PER_LOOK):
            if tick is None or tick > now:
                break
            last = tick
            if self._claim(conn, row, tick, now):
                status = self._run(conn, row, tick, report)
                report.count(status, tick)
            tick = timing.next_after(tick)
        following = tick if tick is not None and tick > now else timing.next_after(now)
        conn.execute(
            update(schedules)
            .where(schedules.c.schedule_id == row["schedule_id"])
            .values(next_tick=following, **({"last_tick": last} if last else {}), updated_at=now)
        )

    def _first(
        self,
        timing: Timing,
        row: Mapping[Any, Any],
        due: datetime,
        now: datetime,
        report: TickReport,
    ) -> datetime | None:
        """The first tick to fire now. A tick late by less than AGENTSTATE_SCHEDULE_GRACE
        is merely late (beat was busy, a worker was killed): it fires, and so do those
        after it. Later than that, beat was down: ``latest`` fires the most recent tick
        once, ``none`` only those still within the grace (None: nothing to fire)."""
        if (now - due).total_seconds() <= self.rules.grace_s:
            return due
        report.missed += 1
        if row["catch_up"] == CatchUp.LATEST:
            return timing.latest_due(due, now)
        return timing.next_after(now - timedelta(seconds=self.rules.grace_s))

    @staticmethod
    def _claim(conn: Connection, row: Mapping[Any, Any], tick: datetime, now: datetime) -> bool:
        """The tick's guarded row; False if the tick has one already (it fired)."""
        inserted = conn.execute(
            dialect_insert(conn, schedule_runs)
            .values(
                schedule_id=row["schedule_id"],
                tick=tick,
                user_id=row["user_id"],
                status=RunStatus.FIRED.value,
                fired_at=now,
            )
            .on_conflict_do_nothing()
        )
        return bool(inserted.rowcount)

    def _run(
        self, conn: Connection, row: Mapping[Any, Any], tick: datetime, report: TickReport
    ) -> str:
        run_id = f"{row['schedule_id']}:{tick_text(tick)}"
        outcome: dict[str, str | None] = {"message_id": None, "run_workflow_id": None}
        status, reason = RunStatus.FIRED, None
        if row["overlap"] == Overlap.SKIP and _still_going(conn, row["schedule_id"], tick):
            status, reason = RunStatus.SKIPPED, STILL_GOING
        else:
            try:
                with conn.begin_nested():
                    outcome = self._start(conn, row, run_id, report)
            except BadInputError as exc:
                status, reason = RunStatus.SKIPPED, str(exc)[:500]
        conn.execute(
            update(schedule_runs)
            .where(schedule_runs.c.schedule_id == row["schedule_id"], schedule_runs.c.tick == tick)
            .values(status=status.value, reason=reason, **outcome)
        )
        if status == RunStatus.FIRED:
            data = {
                "schedule_id": row["schedule_id"],
                "tick": tick_text(tick),
                "user_id": row["user_id"],
                "session_id": row["target_session_id"],
                "message_id": outcome["message_id"],
                "workflow_id": outcome["run_workflow_id"],
            }
            enqueue(
                conn, WebhookEvent.SCHEDULE_FIRED, row["user_id"], data, row["target_session_id"]
            )
        return status

    def _start(
        self, conn: Connection, row: Mapping[Any, Any], run_id: str, report: TickReport
    ) -> dict[str, str | None]:
        user_id = str(row["user_id"])
        if row["text"] is not None:
            session_id = str(row["target_session_id"])
            item = self.inbox.accept_in(conn, session_id, user_id, str(row["text"]), run_id)
            if item.needs_kick:
                report.kicks.append((session_id, item.session_revision))
            return {"message_id": item.message_id, "run_workflow_id": None}
        spec = {**codec.loads(row["workflow"]), "workflow_id": run_id}
        wf = parse_spec(spec, None, limits=self.rules.limits)
        roots, asked = insert_workflow(
            conn,
            wf,
            approval_ttl_s=self.rules.approval_ttl_s,
            user_id=user_id,
            max_pending_approvals=self.rules.max_pending_approvals,
        )
        if wf.session_id:
            log.append(conn, wf.session_id, asked)
        report.started.append((wf, roots))
        return {"message_id": None, "run_workflow_id": wf.workflow_id}


def _still_going(conn: Connection, schedule_id: str, tick: datetime) -> bool:
    """Whether the last tick that fired before ``tick`` has a message not yet answered or a
    workflow still running."""
    last = conn.execute(
        select(schedule_runs.c.message_id, schedule_runs.c.run_workflow_id)
        .where(
            schedule_runs.c.schedule_id == schedule_id,
            schedule_runs.c.tick < tick,
            schedule_runs.c.status == RunStatus.FIRED.value,
        )
        .order_by(schedule_runs.c.tick.desc())
        .limit(1)
    ).first()
    if last is None:
        return False
    if last.run_workflow_id is not None:
        status = conn.execute(
            select(workflows.c.status).where(workflows.c.workflow_id == last.run_workflow_id)
        ).scalar()
        return status == WorkflowStatus.RUNNING
    state = conn.execute(
        select(inbox.c.state).where(inbox.c.message_id == last.message_id)
    ).scalar()
    return state in (InboxState.QUEUED, InboxState.STARTED)


class SendRoots(Protocol):
    """How a tick's stored workflows get their root steps sent (``WorkflowEngine``)."""

    def dispatch_roots(self, wf: WorkflowState, roots: list[Dispatch]) -> None:
        """Send ``wf``'s ``roots``."""


def follow_up(report: TickReport, dispatcher: Dispatcher, send_roots: SendRoots) -> None:
    """After the commit: kick the sessions whose message starts a turn, send the stored
    workflows' roots. A failure here loses nothing (the recovery sweep sends them)."""
    for session_id, revision in report.kicks:
        try:
            dispatcher.phase(Phase.UNDERSTANDING, session_id, revision)
        except Exception as exc:  # the broker: the message is durable, the sweep kicks it
            logger.warning("kick of %s failed, the sweep will send it: %r", session_id, exc)
    for wf, roots in report.started:
        try:
            send_roots.dispatch_roots(wf, roots)
        except Exception as exc:
            logger.warning("roots of %s not sent, the sweep will: %r", wf.workflow_id, exc)
