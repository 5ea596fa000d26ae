"""A step's success counts its dependents down by their whole primary key (up to
KEYED_DEPENDENTS_MAX of them; a wider fan-out by one ``ANY``): every shape counts each
dependent down once and releases it when its last dependency succeeds, under a claim,
unclaimed and from a carried message; and the statement's cached (generic) plan reads
only the rows it changes, however big the workflow (the ``ANY`` form's generic plan read
every step of the workflow on each success, which made a big DAG quadratic)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, text

from config import Settings
from state.agent import quick
from state.dispatch import RecordingDispatcher
from state.documents.codec import Document
from state.storage.backend import Backend
from state.storage.tables import steps
from state.workflows.calls import ActionFn
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from state.workflows.store_postgres import KEYED_DEPENDENTS_MAX, SuccessGuard, succeed_statement


@quick
def one(inputs: Document, deps: Document, context: Document) -> Document:
    """Quick: a constant (its step commits once, unclaimed or from its message)."""
    return {"value": 1}


def claimed_one(inputs: Document, deps: Document, context: Document) -> Document:
    """The same, not declared quick: claimed before it runs."""
    return {"value": 1}


ACTIONS: dict[str, ActionFn] = {"one": one, "claimed_one": claimed_one}
FAN_OUTS = [0, 1, 2, KEYED_DEPENDENTS_MAX, KEYED_DEPENDENTS_MAX + 1, 12]


def _engine(settings: Settings) -> tuple[WorkflowEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    store = WorkflowStore.for_engine(Backend.build(settings).engine)
    return WorkflowEngine(store, dispatcher, ACTIONS.get, settings), dispatcher


def _fan_out(engine: WorkflowEngine, children: int, action: str, *, from_root: bool) -> str:
    """Parents p and q (after a root ``r`` when ``from_root``: then their messages carry
    them), each a dependency of every one of ``children`` children."""
    parents: list[dict[str, Any]] = [
        {"step_id": name, "action": action, "dependencies": ["r"] if from_root else []}
        for name in ("p", "q")
    ]
    roots = [{"step_id": "r", "action": "one"}] if from_root else []
    kids = [
        {"step_id": f"k{i:02d}", "action": "one", "dependencies": ["p", "q"]}
        for i in range(children)
    ]
    return engine.start(engine.validate({"steps": [*roots, *parents, *kids]}, ACTIONS))


def _remaining(settings: Settings, workflow_id: str) -> dict[str, int]:
    with Backend.build(settings).engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.step_id, steps.c.remaining_deps).where(
                steps.c.workflow_id == workflow_id, steps.c.step_id.like("k%")
            )
        )
        return {row.step_id: row.remaining_deps for row in rows}


def _sent_steps(dispatcher: RecordingDispatcher) -> list[str]:
    return sorted(str(args[1]) for kind, args in dispatcher.sent if kind == "step")


def _run(engine: WorkflowEngine, dispatcher: RecordingDispatcher, wid: str, sid: str) -> None:
    carried = dispatcher.carried.get(("step", f"{wid}/{sid}", 0))
    assert engine.run_step(wid, sid, 0, f"t-{sid}", carried=carried) == "success"


@pytest.mark.parametrize("children", FAN_OUTS)
@pytest.mark.parametrize(
    ("action", "from_root"),
    [("claimed_one", False), ("one", False), ("one", True)],
    ids=["claimed", "unclaimed", "carried"],
)
def test_each_dependent_is_counted_down_once_and_released_by_its_last_dependency(
    pg_settings: Settings, children: int, action: str, from_root: bool
) -> None:
    engine, dispatcher = _engine(pg_settings)
    workflow_id = _fan_out(engine, children, action, from_root=from_root)
    if from_root:
        _run(engine, dispatcher, workflow_id, "r")
        assert dispatcher.carried.get(("step", f"{workflow_id}/p", 0)) is not None
    kids = [f"k{i:02d}" for i in range(children)]
    dispatcher.sent.clear()
    _run(engine, dispatcher, workflow_id, "p")
    assert _remaining(pg_settings, workflow_id) == dict.fromkeys(kids, 1)
    assert _sent_steps(dispatcher) == []
    _run(engine, dispatcher, workflow_id, "q")
    assert _remaining(pg_settings, workflow_id) == dict.fromkeys(kids, 0)
    assert _sent_steps(dispatcher) == kids
    for kid in kids:
        _run(engine, dispatcher, workflow_id, kid)
    doc = engine.store.document(workflow_id)
    assert doc is not None and doc["status"] == "success"


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows of ``table`` the plan's nodes returned or filtered out, over all loops."""
    found = 0
    if plan.get("Relation Name") == table:
        loops = int(plan.get("Actual Loops", 1))
        found += (
            int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        ) * loops
    for child in plan.get("Plans", []):
        found += _rows_read(child, table)
    return found


@pytest.mark.parametrize("guard", [SuccessGuard.CLAIMED, SuccessGuard.UNCLAIMED])
def test_the_cached_plan_reads_only_the_rows_a_success_changes_in_a_big_workflow(
    pg_settings: Settings, guard: SuccessGuard
) -> None:
    engine, _ = _engine(pg_settings)
    width = 150  # two layers: each first-layer step releases two of the second
    spec = [{"step_id": f"a{i:03d}", "action": "one"} for i in range(width)] + [
        {
            "step_id": f"b{i:03d}",
            "action": "one",
            "dependencies": [f"a{i:03d}", f"a{(i + 1) % width:03d}"],
        }
        for i in range(width)
    ]
    workflow_id = engine.start(engine.validate({"steps": spec}, ACTIONS))
    statement = succeed_statement(guard, 2)
    status = "running" if guard == SuccessGuard.CLAIMED else "pending"
    params = {
        "dependents": ["b000", "b149"],
        "dependent0": "b000",
        "dependent1": "b149",
        "workflow_id": workflow_id,
        "step_id": "a000",
        "revision": 0,
        "now": "2026-01-01T00:00:00Z",
        "outputs": '{"value": 1}',
        "task_id": "t",
        "carried": None,
    }
    values = ", ".join(f"%({name})s" for name in statement.params)
    with Backend.build(pg_settings).engine.connect() as conn:
        conn.execute(
            text(
                "UPDATE workflow_steps SET status = :s WHERE workflow_id = :w AND step_id = 'a000'"
            ),
            {"s": status, "w": workflow_id},
        )
        # The plan Postgres caches for a prepared statement after its first few runs.
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE countdown_probe AS {statement.sql}")
        found = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE countdown_probe({values})", params
        ).scalar_one()
        conn.rollback()
        conn.exec_driver_sql("DEALLOCATE countdown_probe")  # a session's, not undone
    plan = found[0]["Plan"]
    # The step itself, its two dependents, and their dependencies' outputs for the carry.
    assert _rows_read(plan, "workflow_steps") <= 10, plan
