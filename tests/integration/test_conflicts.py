"""Transactions that lock a workflow's rows in another order than a step's success does
(a cancel: the workflow's row, then its open steps) run again when Postgres ends them to
break a deadlock, instead of failing their caller."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError

from config import Settings
from state.dispatch import RecordingDispatcher
from state.storage.backend import Backend
from state.storage.db import retried_on_conflict
from state.storage.tables import steps
from state.workflow import WorkflowStatus
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks.actions import get_action
from tests.support import uid


def _workflow(settings: Settings, engine: Engine) -> str:
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(engine), RecordingDispatcher(), get_action, settings
    )
    spec = {
        "steps": [
            {"step_id": "a", "action": "echo", "inputs": {}},
            {"step_id": "b", "action": "echo", "inputs": {}, "dependencies": ["a"]},
        ]
    }
    return workflows.start(workflows.validate(spec, ["echo"]))


def _success_shaped(engine: Engine, workflow_id: str, holding: threading.Event) -> None:
    """Lock step ``a``'s row, then (once the cancel waits for it) the workflow's: the
    order a step's success takes them in. Its own deadlock check waits longer than the
    cancel's, so Postgres ends the cancel."""
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL deadlock_timeout = '10s'"))
        step_a = "UPDATE workflow_steps SET updated_at = now() WHERE workflow_id = :w"
        conn.execute(text(step_a + " AND step_id = 'a'"), {"w": workflow_id})
        holding.set()
        time.sleep(0.5)  # the cancel holds the workflow's row now, and waits for a's
        conn.execute(
            text("UPDATE workflows SET updated_at = now() WHERE workflow_id = :w"),
            {"w": workflow_id},
        )


def test_a_cancel_that_deadlocks_with_a_steps_commit_runs_again(pg_settings: Settings) -> None:
    engine = Backend.build(pg_settings).engine
    workflow_id = _workflow(pg_settings, engine)
    holding = threading.Event()
    other = threading.Thread(target=_success_shaped, args=(engine, workflow_id, holding))
    other.start()
    assert holding.wait(10)
    finished = WorkflowStore.for_engine(engine).cancel_workflow(workflow_id)
    other.join(30)
    assert finished is not None and finished.status == WorkflowStatus.CANCELLED
    with engine.connect() as conn:
        found = conn.execute(
            select(steps.c.step_id, steps.c.status, steps.c.error).where(
                steps.c.workflow_id == workflow_id
            )
        ).all()
    assert sorted(tuple(row) for row in found) == [
        ("a", "skipped", "cancelled"),
        ("b", "skipped", "cancelled"),
    ]


def test_other_errors_are_not_run_again(pg_settings: Settings) -> None:
    engine = Backend.build(pg_settings).engine
    table = f"conflict_probe_{uid('t').replace('-', '_')}"
    calls: list[Any] = []

    def duplicate_key() -> None:
        calls.append(1)
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TEMP TABLE {table} (id int PRIMARY KEY)"))
            conn.execute(text(f"INSERT INTO {table} VALUES (1), (1)"))

    with pytest.raises(IntegrityError):
        retried_on_conflict(duplicate_key)
    assert len(calls) == 1
