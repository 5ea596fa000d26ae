"""Fair share of workers between users: at most AGENTSTATE_USER_STEP_CONCURRENCY running
steps per owner (work of no owner counts as one more, ""), and at most the fleet's cap
(state.workflows.fleet: a child kept for turns) in all; a ready step beyond either waits
in the database and is released, oldest first, as running steps finish.

The check sits in the claim (one place every non-quick step goes through): a claim is
refused while the owner has ``cap`` steps running, and the refused step is *parked*
(``waiting_since``): its message is acknowledged, it holds no worker and no broker
message, and the recovery sweep does not count it or send it again. A finish releases
the owner's oldest parked steps into the room it made; the sweep releases, users in
turn (round robin, oldest waiter first), whatever a lost release left behind.

Quick actions (``@quick``) never claim, so they are not capped: they hold a worker for
milliseconds, and turns are taken before them (their own queue, consumed first).
"""

from __future__ import annotations

import random
import time

import redis
from sqlalchemy import ColumnElement, Connection, Engine, and_, func, or_, select, update
from sqlalchemy.orm import aliased

from state.clock import utcnow
from state.dispatch import Dispatcher
from state.storage import keys
from state.storage.db import read_connection
from state.storage.tables import steps, workflows
from state.workflow import WorkflowStepStatus
from state.workflows.fleet import Fleet, fleet_running, running_anywhere
from state.workflows.guards import step_at
from state.workflows.records import APPROVED

Released = tuple[str, str, int]  # (workflow_id, step_id, revision) to send
# How many owners one sweep releases for, and how many steps per owner at most.
RELEASE_OWNERS = 500

# A workflow of an owner sends at most cap x WINDOW_PER_SLOT of its quick roots at its
# start; the others are held in the database and handed over as the owner's steps finish.
WINDOW_PER_SLOT = 64
HOLD_BATCH = 1000
# Held steps a finished step looks at (in random order) to hand its place to one.
HAND_OVER_TRIES = 8
# Workflow owners remembered per process (then forgotten all at once: a cheap bound).
OWNERS_CACHED = 10_000

_running = aliased(steps)


class FairShare:
    """Releases parked steps as running ones finish (within their owner's share and the
    fleet's), and sends them."""

    def __init__(
        self,
        engine: Engine,
        dispatcher: Dispatcher,
        cap: int,
        hints: redis.Redis | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.cap = cap
        # Redis, for the hint that an owner has held steps: a finished step of an owner
        # with none (nearly always) then costs no database statement.
        self.hints = hints
        self.fleet = fleet
        self._owners: dict[str, str] = {}  # workflow id -> owner (it never changes)

    def fleet_cap(self) -> int:
        """Claimed steps that may run at once across the fleet (0: no cap)."""
        return 0 if self.fleet is None else self.fleet.cap()

    def owner(self, workflow_id: str) -> str:
        """The workflow's owner ("" for none), remembered."""
        owner = self._owners.get(workflow_id)
        if owner is None:
            owner = owner_of(self.engine, workflow_id)
            if len(self._owners) >= OWNERS_CACHED:
                self._owners.clear()
            self._owners[workflow_id] = owner
        return owner

    def release(self, workflow_id: str) -> list[Released]:
        """A claimed step of the workflow finished (or was refused): send the parked steps
        that now have room; return them. Under a fleet cap the room may be any owner's,
        so waiting owners are served in turn; else only this workflow's owner's."""
        if self.fleet_cap() > 0:
            return self.send(self._into_fleet_room(self.fleet_cap()))
        if self.cap <= 0:
            return []  # no cap: nothing parked
        return self.send(release(self.engine, self.owner(workflow_id), self.cap))

    def window(
        self, workflow_id: str, roots: list[tuple[str, int]], quick: set[str]
    ) -> list[tuple[str, int]]:
        """The roots to send now: all but the ``quick`` ones beyond the owner's window,
        which are held (quick steps claim nothing, so the claim's cap cannot hold them)."""
        if self.cap <= 0:
            return roots
        owner = self.owner(workflow_id)
        limit = self.cap * WINDOW_PER_SLOT
        quick_roots = [step_id for step_id, _ in roots if step_id in quick]
        if len(quick_roots) <= limit:
            return roots
        held = set(quick_roots[limit:])
        hold(self.engine, workflow_id, sorted(held))
        self._hint(owner, True)
        return [(step_id, revision) for step_id, revision in roots if step_id not in held]

    def hand_over(self, workflow_id: str) -> list[Released]:
        """A step of the workflow finished: send its owner's oldest held step, if any."""
        if self.cap <= 0:
            return []
        owner = self.owner(workflow_id)
        if self._hint(owner) is False:
            return []
        handed = hand_over(self.engine, owner)
        if handed is None:  # none held (not merely taken by others meanwhile)
            self._hint(owner, False)
            return []
        return self.send(handed)

    def release_all(self) -> list[Released]:
        """Every owner's parked steps with room, sent one owner's step at a time (round
        robin, the longest waiting owner first), no more than the fleet has room for; the
        sweep's way to heal lost releases, and a finish's under a fleet cap."""
        owners = waiting_owners(self.engine)
        for owner in held_owners(self.engine):
            self._hint(owner, True)  # put back a hint Redis lost
        fleet_cap = self.fleet_cap()
        if fleet_cap <= 0:
            batches = [release(self.engine, owner, self.cap) for owner in owners]
            return self.send(round_robin(batches))
        return self.send(self._into_fleet_room(fleet_cap))

    def _into_fleet_room(self, fleet_cap: int) -> list[Released]:
        """Un-park steps into the fleet's room, one owner's step at a time (the owner
        waiting longest first), each within its owner's share."""
        room = fleet_cap - fleet_running(self.engine)
        if room <= 0:
            return []  # nothing is looked at while the fleet is full: one count
        # Owners with room in their share (one at its cap must not hold the others back).
        owners = waiting_owners(self.engine, limit=room, below_cap=self.cap)
        released: list[Released] = []
        while room > 0 and owners:
            # One step of each owner in turn; an owner with no room (or none left) drops out.
            for owner in list(owners):
                one = release(self.engine, owner, self.cap, limit=1) if room > 0 else []
                if not one:
                    owners.remove(owner)
                released.extend(one)
                room -= len(one)
        return released

    def _hint(self, owner: str, value: bool | None = None) -> bool | None:
        """Read (``value`` None) or set the owner's held-steps hint; None if unknown (no
        Redis, or it failed: then the database is asked)."""
        if self.hints is None:
            return None
        try:
            if value is None:
                return bool(self.hints.exists(keys.steps_held(owner)))
            if value:
                self.hints.set(keys.steps_held(owner), "1")
            else:
                self.hints.delete(keys.steps_held(owner))
        except redis.RedisError:
            return None
        return value

    def send(self, released: list[Released]) -> list[Released]:
        """Send released steps (each at the revision it waited at)."""
        for workflow_id, step_id, revision in released:
            self.dispatcher.step(workflow_id, step_id, revision)
        return released


def under_cap(cap: int, fleet_cap: int = 0) -> ColumnElement[bool]:
    """The claim's condition: the step's owner has fewer than ``cap`` running steps (0:
    no cap), and the fleet fewer than ``fleet_cap`` with a live lease (0: no cap). A step
    found running itself (its worker lost) is taken over regardless; a workflow of no
    owner (the operator's) counts as one more owner, ``""``."""
    running = (
        select(func.count())
        .select_from(_running)
        .where(_running.c.owner == steps.c.owner, _running.c.status == WorkflowStepStatus.RUNNING)
        .scalar_subquery()
    )
    taken_over = steps.c.status == WorkflowStepStatus.RUNNING
    conditions: list[ColumnElement[bool]] = []
    if cap > 0:
        conditions.append(or_(taken_over, running < cap))
    if fleet_cap > 0:
        conditions.append(or_(taken_over, running_anywhere() < fleet_cap))
    if not conditions:
        return steps.c.status.is_not(None)  # always true, keeps one statement shape
    return and_(*conditions)


def lock_owner(conn: Connection, owner: str) -> None:
    """Take ``owner``'s fair-share lock for the rest of ``conn``'s transaction (Postgres;
    SQLite has one writer at a time anyway): claims and releases count in turn."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"steps:{owner}"))))


def park(engine: Engine, workflow_id: str, step_id: str, revision: int) -> bool:
    """Mark a ready step at ``revision`` as waiting for its owner's share; False if it is
    not ready and runnable at that revision (a duplicate, or not due)."""
    with engine.begin() as conn:
        row = conn.execute(
            update(steps)
            .where(
                *step_at(workflow_id, step_id, revision),
                steps.c.status.in_((WorkflowStepStatus.PENDING, WorkflowStepStatus.RETRYING)),
                steps.c.remaining_deps == 0,
                or_(steps.c.approval.is_(None), steps.c.approval == APPROVED),
            )
            .values(waiting_since=func.coalesce(steps.c.waiting_since, time.time()))
            .returning(steps.c.step_id)
        ).first()
    return row is not None


def release(engine: Engine, owner: str, cap: int, limit: int | None = None) -> list[Released]:
    """Un-park ``owner``'s oldest waiting steps into the room below ``cap`` (0: no cap),
    ``limit`` at most; return them to send. Two releases at once may both see room: the
    loser's claim parks the step again, so the caps hold at the claim, not here."""
    if cap <= 0 and limit is None:
        return []
    with engine.begin() as conn:
        lock_owner(conn, owner)
        room = cap - _running_count(conn, owner) if cap > 0 else limit or 0
        room = room if limit is None else min(room, limit)
        if room <= 0:
            return []
        oldest = conn.execute(
            select(steps.c.workflow_id, steps.c.step_id)
            .where(steps.c.owner == owner, steps.c.waiting_since.is_not(None))
            .order_by(steps.c.waiting_since)
            .limit(room)
        ).all()
        released: list[Released] = []
        for workflow_id, step_id in oldest:
            revision = _unpark(conn, workflow_id, step_id)
            if revision is not None:
                released.append((workflow_id, step_id, revision))
    return released


def _unpark(conn: Connection, workflow_id: str, step_id: str) -> int | None:
    """Take a parked step out of the waiting set; its revision, or None if another
    releaser took it first."""
    row = conn.execute(
        update(steps)
        .where(
            steps.c.workflow_id == workflow_id,
            steps.c.step_id == step_id,
            steps.c.waiting_since.is_not(None),
        )
        .values(waiting_since=None, held=False, updated_at=utcnow())
        .returning(steps.c.revision)
    ).first()
    return None if row is None else int(row[0])


def hold(engine: Engine, workflow_id: str, step_ids: list[str]) -> None:
    """Park a new workflow's quick roots beyond its owner's window (``held``): finished
    steps of the owner hand them over one by one."""
    now = time.time()
    with engine.begin() as conn:
        for start in range(0, len(step_ids), HOLD_BATCH):
            batch = step_ids[start : start + HOLD_BATCH]
            conn.execute(
                update(steps)
                .where(steps.c.workflow_id == workflow_id, steps.c.step_id.in_(batch))
                .values(waiting_since=now, held=True)
            )


def hand_over(engine: Engine, owner: str) -> list[Released] | None:
    """Un-park one of ``owner``'s oldest held steps: a finished step's place in the
    owner's window goes to it. None if the owner has none held; [] if others took the
    ones looked at first (finished steps hand over at once: they try a few)."""
    with engine.begin() as conn:
        oldest = conn.execute(
            select(steps.c.workflow_id, steps.c.step_id)
            .where(steps.c.owner == owner, steps.c.waiting_since.is_not(None), steps.c.held)
            .order_by(steps.c.waiting_since)
            .limit(HAND_OVER_TRIES)
        ).all()
    if not oldest:
        return None
    for workflow_id, step_id in random.sample(oldest, len(oldest)):
        with engine.begin() as conn:
            revision = _unpark(conn, workflow_id, step_id)
        if revision is not None:
            return [(workflow_id, step_id, revision)]
    return []


def waiting_owners(engine: Engine, limit: int = RELEASE_OWNERS, below_cap: int = 0) -> list[str]:
    """Owners with parked steps, the longest waiting first (the sweep's round robin); with
    ``below_cap``, only those running fewer steps than that (room in their share)."""
    running = (
        select(func.count())
        .select_from(_running)
        .where(_running.c.owner == steps.c.owner, _running.c.status == WorkflowStepStatus.RUNNING)
        .scalar_subquery()
    )
    where: list[ColumnElement[bool]] = [steps.c.waiting_since.is_not(None)]
    if below_cap > 0:
        where.append(running < below_cap)
    with read_connection(engine) as conn:
        rows = conn.execute(
            select(steps.c.owner)
            .where(*where)
            .group_by(steps.c.owner)
            .order_by(func.min(steps.c.waiting_since))
            .limit(limit)
        )
        return [r[0] for r in rows]


def held_owners(engine: Engine, limit: int = RELEASE_OWNERS) -> list[str]:
    """Owners with quick steps held back at a workflow's start."""
    with read_connection(engine) as conn:
        rows = conn.execute(
            select(steps.c.owner)
            .where(steps.c.waiting_since.is_not(None), steps.c.held)
            .group_by(steps.c.owner)
            .limit(limit)
        )
        return [r[0] for r in rows]


def round_robin(batches: list[list[Released]]) -> list[Released]:
    """One step of each owner in turn: every owner's first, then every second, ..."""
    out: list[Released] = []
    for index in range(max((len(b) for b in batches), default=0)):
        out.extend(batch[index] for batch in batches if index < len(batch))
    return out


def owner_of(engine: Engine, workflow_id: str) -> str:
    """A workflow's owner as its steps record it ("" for none)."""
    with read_connection(engine) as conn:
        owner = conn.execute(
            select(workflows.c.user_id).where(workflows.c.workflow_id == workflow_id)
        ).scalar()
    return str(owner or "")


def steps_waiting(engine: Engine) -> int:
    """Ready steps parked for their owner's share (for metrics: a gauge)."""
    with read_connection(engine) as conn:
        count = conn.execute(
            select(func.count()).select_from(steps).where(steps.c.waiting_since.is_not(None))
        ).scalar()
    return int(count or 0)


def _running_count(conn: Connection, owner: str) -> int:
    count = conn.execute(
        select(func.count())
        .select_from(steps)
        .where(steps.c.owner == owner, steps.c.status == WorkflowStepStatus.RUNNING)
    ).scalar()
    return int(count or 0)
