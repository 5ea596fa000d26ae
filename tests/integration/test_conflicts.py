"""Transactions that lock a workflow's rows in another order than a step's success does
(a cancel: the workflow's row, then its open steps) run again when Postgres ends them to
break a deadlock, instead of failing their caller; so does the step's own commit when it
is the one Postgres ends (raised, the task's retry would run its action again)."""

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


def _cancel_shaped(engine: Engine, workflow_id: str, holding: threading.Event) -> None:
    """Lock the workflow's row, then (once a step's commit waits for it) step ``a``'s:
    a cancel's order. Its own deadlock check waits longer, so Postgres ends the step's
    commit."""
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL deadlock_timeout = '10s'"))
        conn.execute(
            text("UPDATE workflows SET updated_at = now() WHERE workflow_id = :w"),
            {"w": workflow_id},
        )
        holding.set()
        deadline = time.monotonic() + 20
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        while not conn.execute(text(waiting)).scalar() and time.monotonic() < deadline:
            time.sleep(0.02)  # until the step's commit holds a's row and waits for ours
        conn.execute(
            text(
                "UPDATE workflow_steps SET updated_at = now() "
                "WHERE workflow_id = :w AND step_id = 'a'"
            ),
            {"w": workflow_id},
        )


@pytest.mark.parametrize("outcome", ["succeed", "fail"])
def test_a_steps_commit_that_deadlocks_is_committed_again_not_raised(
    pg_settings: Settings, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A step's success (or failure) chosen as a deadlock's victim commits again: raised,
    it would reach the task's retry, which runs the action a second time."""
    engine = Backend.build(pg_settings).engine
    store = WorkflowStore.for_engine(engine)
    workflow_id = _workflow(pg_settings, engine)
    claimed = store.claim(workflow_id, "a", 0, lease_s=30.0)
    assert claimed is not None
    holding = threading.Event()
    other = threading.Thread(target=_cancel_shaped, args=(engine, workflow_id, holding))
    other.start()
    assert holding.wait(10)
    with caplog.at_level("INFO", logger="state.storage.db"):
        if outcome == "succeed":
            store.succeed(claimed, {"value": 1})
        else:
            store.fail(claimed, "boom")
    other.join(30)
    assert "SQLSTATE 40P01" in caplog.text  # it was the victim, and ran again
    with engine.connect() as conn:
        found = dict(
            conn.execute(
                select(steps.c.step_id, steps.c.status).where(steps.c.workflow_id == workflow_id)
            ).all()
        )
    expected = {
        "succeed": {"a": "success", "b": "pending"},
        "fail": {"a": "failed", "b": "skipped"},
    }
    assert found == expected[outcome]
