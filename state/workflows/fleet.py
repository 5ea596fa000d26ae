"""The fleet's worker children, and how many of them workflow steps may hold at once.

A per-user cap bounds one user; it does not bound what several users' long steps (or
operator work) take together: two users at their caps filled all four children of the
plain two workers, and turns waited for a 20 s step to end. So claimed steps are also
capped fleet-wide: at most (live children - AGENTSTATE_CHILDREN_FOR_TURNS, at least 1)
run at once, counting only steps whose lease is live (a lost worker's step frees its
place when its lease runs out).

Each worker's main process says, every few seconds, how many children it runs
(:func:`announce`); a worker not heard from for :data:`ALIVE_FOR_S` stops counting. The
count lives in Redis: losing it only lifts the fleet cap until the workers next announce
(the per-user caps still hold).
"""

from __future__ import annotations

import time

import redis
from sqlalchemy import ColumnElement, Connection, Engine, func, select
from sqlalchemy.orm import aliased

from state.storage import keys
from state.storage.db import read_connection
from state.storage.tables import steps
from state.workflow import WorkflowStepStatus

ANNOUNCE_EVERY_S = 5.0
ALIVE_FOR_S = 20.0
# How long a process trusts the count it read (a claim reads it at most this often).
CACHED_FOR_S = 2.0

_running = aliased(steps)


def announce(client: redis.Redis, queue: str, node: str, children: int, serves: str) -> None:
    """Say that worker ``node`` runs ``children`` children for ``queue``'s turns and
    steps (``serves`` "both"), its steps only ("steps") or its turns only ("turns"), for
    the next ALIVE_FOR_S seconds."""
    now = time.time()
    with client.pipeline(transaction=False) as pipe:
        pipe.hset(keys.fleet_children(queue), node, f"{children}:{serves}")
        pipe.zadd(keys.fleet_alive(queue), {node: now + ALIVE_FOR_S})
        pipe.zremrangebyscore(keys.fleet_alive(queue), "-inf", now - ALIVE_FOR_S)
        pipe.execute()


def leave(client: redis.Redis, queue: str, node: str) -> None:
    """Worker ``node`` stops serving ``queue`` (it shuts down)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.fleet_alive(queue), node)
        pipe.hdel(keys.fleet_children(queue), node)
        pipe.execute()


def live_cap(client: redis.Redis, queue: str, for_turns: int) -> int:
    """The fleet cap the workers serving ``queue`` heard from lately make (0: none)."""
    nodes = client.zrangebyscore(keys.fleet_alive(queue), time.time(), "+inf")
    if not nodes:
        return 0
    values = client.hmget(keys.fleet_children(queue), nodes)  # type: ignore[arg-type]
    step_children, turns_pool = 0, False
    for value in values:
        if value is None:
            continue
        children, _, serves = (value.decode() if isinstance(value, bytes) else value).partition(":")
        if serves == "turns":
            turns_pool = True
        elif children.isdigit():
            step_children += int(children)
    return step_cap(step_children, 0 if turns_pool else for_turns)


def step_cap(children: int, for_turns: int) -> int:
    """Claimed steps that may run at once among ``children`` that also serve turns (0: no
    cap, when none are known or none need keeping: ``for_turns`` 0, or turns have a pool
    of their own); at least 1, so steps always make progress."""
    if children <= 0 or for_turns <= 0:
        return 0
    return max(1, children - for_turns)


class Fleet:
    """The fleet-wide cap of claimed steps, as one process reads it (cached briefly)."""

    def __init__(self, client: redis.Redis | None, queue: str, for_turns: int) -> None:
        self.client = client
        self.queue = queue
        self.for_turns = for_turns
        self._cap = 0
        self._read_at = float("-inf")

    def cap(self) -> int:
        """Claimed steps that may run at once across the fleet now (0: no cap)."""
        if self.client is None or self.for_turns <= 0:
            return 0
        now = time.monotonic()
        if now - self._read_at >= CACHED_FOR_S:
            try:
                self._cap = live_cap(self.client, self.queue, self.for_turns)
            except redis.RedisError:
                self._cap = 0  # without Redis the per-user caps still hold
            self._read_at = now
        return self._cap


def running_anywhere() -> ColumnElement[int]:
    """Claimed steps running anywhere with a live lease (a lost worker's stops counting
    when its lease runs out), as a subquery of the claim."""
    return (
        select(func.count())
        .select_from(_running)
        .where(
            _running.c.status == WorkflowStepStatus.RUNNING,
            _running.c.lease_expires_at > time.time(),
        )
        .scalar_subquery()
    )


def lock_fleet(conn: Connection) -> None:
    """Take the fleet's lock for the rest of ``conn``'s transaction (after the owner's,
    never before): capped claims count the fleet's running steps in turn."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext("steps:*fleet*"))))


def fleet_running(engine: Engine) -> int:
    """Claimed steps running anywhere with a live lease."""
    with read_connection(engine) as conn:
        count = conn.execute(
            select(func.count())
            .select_from(steps)
            .where(
                steps.c.status == WorkflowStepStatus.RUNNING,
                steps.c.lease_expires_at > time.time(),
            )
        ).scalar()
    return int(count or 0)
