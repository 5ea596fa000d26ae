"""Under the inline policy a quick step runs the quick steps it releases in the same
delivery (each its own commit); a chain cut short is found again by the redelivery of
the message that started it. On Postgres and SQLite."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from config import HopPolicy, Settings
from state.agent import quick
from state.dispatch import RecordingDispatcher
from state.documents.codec import Document
from state.storage.backend import Backend
from state.storage.tables import steps
from state.workflows import engine as workflow_engine
from state.workflows.calls import ActionFn
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore


@quick
def add_one(inputs: Document, deps: Document, context: Document) -> Document:
    """Quick: one more than the largest dependency's value (or the input's)."""
    values = [int(out["value"]) for out in deps.values()] or [int(inputs.get("value", 0))]
    return {"value": max(values) + 1}


def claimed_add_one(inputs: Document, deps: Document, context: Document) -> Document:
    """The same, not declared quick: its step is claimed and sent, never continued."""
    return add_one(inputs, deps, context)


@quick
def divide(inputs: Document, deps: Document, context: Document) -> Document:
    """Quick, and fails for a zero divisor (not retried: max_retries 0)."""
    return {"value": 1 / int(inputs["by"])}


ACTIONS: dict[str, ActionFn] = {
    "add_one": add_one,
    "claimed_add_one": claimed_add_one,
    "divide": divide,
}


def _engine(settings: Settings, policy: HopPolicy) -> tuple[WorkflowEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    store = WorkflowStore.for_engine(Backend.build(settings).engine)
    inline = settings.model_copy(update={"hop_policy": policy})
    return WorkflowEngine(store, dispatcher, ACTIONS.get, inline), dispatcher


def _chain(engine: WorkflowEngine, *actions: str, **extra: Any) -> str:
    """A workflow s0 -> s1 -> ... of the given actions; its id (roots dispatched)."""
    spec = [
        {
            "step_id": f"s{i}",
            "action": action,
            "dependencies": [f"s{i - 1}"] if i else [],
            **extra.get(f"s{i}", {}),
        }
        for i, action in enumerate(actions)
    ]
    return engine.start(engine.validate({"steps": spec}, ACTIONS))


def _rows(settings: Settings, workflow_id: str) -> dict[str, tuple[str, str | None]]:
    with Backend.build(settings).engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.step_id, steps.c.status, steps.c.last_task_id).where(
                steps.c.workflow_id == workflow_id
            )
        )
        return {row.step_id: (row.status, row.last_task_id) for row in rows}


def _steps_sent(dispatcher: RecordingDispatcher) -> list[str]:
    return [str(args[1]) for kind, args in dispatcher.sent if kind == "step"]


def test_a_chain_of_quick_steps_runs_in_one_delivery_under_the_inline_policy(
    settings: Settings,
) -> None:
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(engine, "add_one", "add_one", "add_one", "add_one")
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    assert _steps_sent(dispatcher) == []  # nothing left to send
    assert _rows(settings, workflow_id) == {f"s{i}": ("success", "t-1") for i in range(4)}
    doc = engine.store.document(workflow_id)
    assert doc is not None and doc["status"] == "success"
    assert doc["steps"]["s3"]["outputs"] == {"value": 4}


def test_every_phase_sends_each_released_step(settings: Settings) -> None:
    engine, dispatcher = _engine(settings, HopPolicy.EVERY_PHASE)
    workflow_id = _chain(engine, "add_one", "add_one")
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    assert _steps_sent(dispatcher) == ["s1"]
    assert _rows(settings, workflow_id)["s1"] == ("pending", None)


def test_one_released_step_continues_and_the_others_are_sent(settings: Settings) -> None:
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    spec = {
        "steps": [
            {"step_id": "a", "action": "add_one"},
            {"step_id": "b", "action": "add_one", "dependencies": ["a"]},
            {"step_id": "c", "action": "add_one", "dependencies": ["a"]},
            {"step_id": "d", "action": "add_one", "dependencies": ["b", "c"]},
        ]
    }
    workflow_id = engine.start(engine.validate(spec, ACTIONS))
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "a", 0, "t-a") == "success"
    rows = _rows(settings, workflow_id)
    continued, sent = ("b", "c") if rows["b"][0] == "success" else ("c", "b")
    assert rows[continued] == ("success", "t-a")
    assert _steps_sent(dispatcher) == [sent]  # the other runs in parallel elsewhere
    assert rows["d"] == ("pending", None)  # still waits for it
    assert engine.run_step(workflow_id, sent, 0, "t-2") == "success"
    assert _rows(settings, workflow_id)["d"] == ("success", "t-2")


def test_a_step_that_is_not_quick_is_sent_not_continued(settings: Settings) -> None:
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(engine, "add_one", "claimed_add_one", "add_one")
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    assert _steps_sent(dispatcher) == ["s1"]
    assert engine.run_step(workflow_id, "s1", 0, "t-2") == "success"  # claimed, then on
    rows = _rows(settings, workflow_id)
    assert rows["s1"] == ("success", "t-2") and rows["s2"][0] == "pending"


@pytest.mark.parametrize("slow", ["b", "c"])
def test_the_quick_one_of_the_released_steps_continues_whatever_their_order(
    settings: Settings, slow: str
) -> None:
    # One of the two steps released together is not quick: the quick one runs here
    # (whichever comes first in what the commit returned), the other is sent.
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    fast = "c" if slow == "b" else "b"
    action = {slow: "claimed_add_one", fast: "add_one"}
    spec = {
        "steps": [
            {"step_id": "a", "action": "add_one"},
            {"step_id": "b", "action": action["b"], "dependencies": ["a"]},
            {"step_id": "c", "action": action["c"], "dependencies": ["a"]},
        ]
    }
    workflow_id = engine.start(engine.validate(spec, ACTIONS))
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "a", 0, "t-a") == "success"
    rows = _rows(settings, workflow_id)
    assert rows[fast] == ("success", "t-a")
    assert rows[slow] == ("pending", None)
    assert _steps_sent(dispatcher) == [slow]


def test_a_failing_continued_step_is_counted_like_any_attempt(settings: Settings) -> None:
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(
        engine, "add_one", "divide", "add_one", s1={"inputs": {"by": 0}, "max_retries": 0}
    )
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    rows = _rows(settings, workflow_id)
    assert rows["s1"] == ("failed", "t-1") and rows["s2"][0] == "skipped"
    doc = engine.store.document(workflow_id)
    assert doc is not None and doc["status"] == "failed"


def test_a_chain_stops_after_its_step_limit_and_sends_the_next(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_engine, "CONTINUE_STEPS", 2)
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(engine, *["add_one"] * 5)
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    assert _steps_sent(dispatcher) == ["s3"]  # s0, then 2 continued
    statuses = {step: status for step, (status, _) in _rows(settings, workflow_id).items()}
    assert statuses == {
        "s0": "success",
        "s1": "success",
        "s2": "success",
        "s3": "pending",
        "s4": "pending",
    }


def test_a_redelivery_sends_what_a_chain_cut_short_left_unsent(settings: Settings) -> None:
    """A worker lost mid-chain: its first step's message comes again (redelivered), finds
    the steps committed under its task id, and sends the one after the last of them."""
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(engine, "add_one", "add_one", "add_one", "add_one")
    store = engine.store
    for step_id in ("s0", "s1"):  # what the lost worker committed before it died
        peeked = store.peek(workflow_id, step_id, 0)
        assert peeked is not None
        store.succeed_unclaimed(replace(peeked, task_id="t-1"), {})
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1", redelivered=True) == "resumed"
    assert _steps_sent(dispatcher) == ["s2"]
    dispatcher.sent.clear()
    # Another task's message for the same step is a plain duplicate.
    assert engine.run_step(workflow_id, "s0", 0, "t-other", redelivered=True) == "duplicate"
    assert _steps_sent(dispatcher) == []


def test_a_step_taken_into_a_chain_is_sent_if_the_delivery_stops_before_its_commit(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database goes away after the first commit: the step the chain took is sent
    (not left to the sweep) and the error still stops the delivery."""
    engine, dispatcher = _engine(settings, HopPolicy.INLINE)
    workflow_id = _chain(engine, "add_one", "add_one", "add_one")
    dispatcher.sent.clear()
    peek = engine.store.peek
    calls: list[str] = []

    def peek_then_fail(workflow_id: str, step_id: str, revision: int) -> Any:
        calls.append(step_id)
        if len(calls) > 1:
            raise ConnectionError("the database went away")
        return peek(workflow_id, step_id, revision)

    def commit_fails(*args: Any) -> Any:
        raise ConnectionError("the database went away")

    monkeypatch.setattr(engine.store, "peek", peek_then_fail)
    # On Postgres s1 runs from what s0's commit carried (no read), and its commit fails.
    monkeypatch.setattr(engine.store, "succeed_carried", commit_fails)
    with pytest.raises(ConnectionError):
        engine.run_step(workflow_id, "s0", 0, "t-1")
    assert calls == (["s0"] if engine.store.verifies_carried else ["s0", "s1"])
    assert _steps_sent(dispatcher) == ["s1"]
    assert _rows(settings, workflow_id)["s1"] == ("pending", None)
