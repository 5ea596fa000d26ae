"""The floor: Celery tasks that commit one prepared UPDATE each, and nothing more.

A phase of agentstate is a broker hop plus one durable commit. These tasks are the least
that can be: a hop that commits one prepared ``UPDATE`` of one row on Postgres, on a
connection of its own process, then enqueues the next hop. Six of them make a turn's
floor; one of them is a workflow step's floor. Workers load them with
``AGENTSTATE_ACTION_MODULES=bench.floor_tasks`` (the table comes from :func:`setup`).

:func:`hop_write` is the floor with agentstate's own durable write instead of that
``UPDATE``: each hop commits what a phase commits (the session's document, its
``phase_committed`` event and its revision record, guarded by the revision), through the
session store a worker uses, and nothing else a phase does (no handler, no lock, no
cache, no push). Between the floor, it and ``every_phase``, the CPU rows split a phase's
cost into the write and the rest.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg2
from celery.signals import worker_process_init

from state.documents.codec import Document
from state.machine import WORK_PHASES
from state.session import SessionStatus
from state.sessions.rows import new_document
from state.sessions.snapshot import SessionChange, Snapshot
from state.storage import keys
from tasks.actions import action
from tasks.app import app
from tasks.worker.guard import GUARD_STRATEGY

TABLE = "bench_floor"
CREATE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id text PRIMARY KEY,
    revision bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
)"""
PREPARE = (
    f"PREPARE bench_floor_bump (text) AS UPDATE {TABLE} "
    "SET revision = revision + 1, updated_at = now() WHERE id = $1"
)

_local = threading.local()


def _connection() -> Any:
    """This process's (and thread's) connection, with the UPDATE prepared on it."""
    conn = getattr(_local, "conn", None)
    if conn is None or getattr(_local, "pid", None) != os.getpid():
        conn = _connect()
        _local.conn, _local.pid = conn, os.getpid()
    return conn


def _connect() -> Any:
    from config import get_settings

    url = get_settings().database_url.replace("postgresql+psycopg2://", "postgresql://")
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute(PREPARE)
    conn.commit()
    return conn


@worker_process_init.connect
def _connect_at_start(**_: object) -> None:
    # Each pool child opens its connection when it starts, not in its first task.
    _local.conn, _local.pid = _connect(), os.getpid()


def commit(row_id: str) -> None:
    """One prepared UPDATE of ``row_id``, committed."""
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute("EXECUTE bench_floor_bump (%s)", (row_id,))
    conn.commit()


@app.task(name="agentstate.bench.hop", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def hop(self: Any, remaining: int, row_id: str | None, counter: str, stamp: bool = False) -> None:
    """One hop: commit ``row_id`` (if named), then enqueue the next hop until none remain.

    The last hop counts itself in ``counter`` or, with ``stamp``, records when it ran
    (a latency probe).
    """
    if row_id is not None:
        commit(row_id)
    if remaining > 1:
        self.app.send_task("agentstate.bench.hop", args=[remaining - 1, row_id, counter, stamp])
    elif stamp:
        _redis().set(keys.baseline_counter(counter), repr(time.time()), ex=3600)
    else:
        _redis().incr(keys.baseline_counter(counter))


WRITE_USER = "bench-write-user"


def write_document(session_id: str, revision: int) -> Document:
    """The document a hop at ``revision`` writes: shaped like a turn's (the message in
    the context window, the path the turn took so far), growing one phase a hop."""
    doc = new_document(session_id, WRITE_USER)
    path = [phase.value for phase in WORK_PHASES[: revision % len(WORK_PHASES) + 1]]
    doc["context_window"] = {"message": "hello number 1", "attempt": 1, "intent": {"kind": "chat"}}
    doc["metadata"] = {"turn": {"message_id": f"msg-{session_id}", "path": path}}
    return doc


def _phase_at(revision: int) -> str:
    return WORK_PHASES[revision % len(WORK_PHASES)].value


@app.task(name="agentstate.bench.hop_write", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def hop_write(self: Any, remaining: int, session_id: str, revision: int, counter: str) -> None:
    """One hop committing a phase's write at ``revision`` (the module docstring), then
    the next hop, until none remain; the last one counts itself in ``counter``."""
    from tasks.worker.runtime import runtime

    active = SessionStatus.ACTIVE.value
    doc = write_document(session_id, revision)
    before = Snapshot(session_id, WRITE_USER, _phase_at(revision), active, revision, doc, 0)
    change = SessionChange(
        phase=_phase_at(revision + 1),
        status=active,
        doc=write_document(session_id, revision + 1),
        task_id=self.request.id,
        trigger="bench",
    )
    runtime().services.sessions.commit(before, change)
    if remaining > 1:
        next_args = [remaining - 1, session_id, revision + 1, counter]
        self.app.send_task("agentstate.bench.hop_write", args=next_args)
    else:
        _redis().incr(keys.baseline_counter(counter))


@app.task(name="agentstate.bench.commit_once", bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def commit_once(self: Any, row_id: str, counter: str) -> None:
    """A task that commits once (a workflow step's floor) and counts itself."""
    commit(row_id)
    _redis().incr(keys.baseline_counter(counter))


def _redis() -> Any:
    from config import get_settings
    from state.storage.redis_client import get_redis

    return get_redis(get_settings().redis_url)


@action("claimed_echo")
def claimed_echo(inputs: Document, deps: Document, context: Document) -> Document:
    """``echo`` not declared quick: its step is claimed (marked running), then completed,
    as any action's is unless it says it is quick: the DAG row's second measurement."""
    return dict(inputs)
