"""A released quick step's message carries what a peek would read, and its first delivery
runs from that without reading; the success lands only if the row still holds exactly
what was carried. A forged, stale or malformed payload commits nothing of its own: the
step is read and run as usual. On Postgres (the store that binds it); the portable
store carries nothing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from config import HopPolicy, Settings
from state.agent import quick
from state.dispatch import RecordingDispatcher
from state.documents import codec
from state.documents.codec import Document
from state.storage.backend import Backend
from state.storage.tables import steps
from state.workflows.calls import ActionFn
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tests.support import uid


@quick
def total(inputs: Document, deps: Document, context: Document) -> Document:
    """Quick: the input's value plus every dependency's."""
    return {"value": int(inputs.get("value", 0)) + sum(int(o["value"]) for o in deps.values())}


def claimed_total(inputs: Document, deps: Document, context: Document) -> Document:
    """The same, not declared quick: claimed before it runs."""
    return total(inputs, deps, context)


ACTIONS: dict[str, ActionFn] = {"total": total, "claimed_total": claimed_total}


def _engine(
    settings: Settings, policy: HopPolicy = HopPolicy.EVERY_PHASE
) -> tuple[WorkflowEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    store = WorkflowStore.for_engine(Backend.build(settings).engine)
    # A queue of its own: workers other modules ran on the default queue may still count
    # in its fleet cap for a few seconds (tests/integration/test_fleet_cap.py tests that).
    tuned = settings.model_copy(update={"hop_policy": policy, "queue": uid("q")})
    return WorkflowEngine(store, dispatcher, ACTIONS.get, tuned), dispatcher


def _diamond(engine: WorkflowEngine, last: str = "total", **extra: Any) -> str:
    """a and b (values 1 and 2) -> c (value 10, action ``last``); its id."""
    spec = [
        {"step_id": "a", "action": "total", "inputs": {"value": 1}},
        {"step_id": "b", "action": "total", "inputs": {"value": 2}},
        {"step_id": "c", "action": last, "inputs": {"value": 10}, "dependencies": ["a", "b"]},
    ]
    spec[2].update(extra)
    return engine.start(engine.validate({"steps": spec}, ACTIONS))


def _carried(dispatcher: RecordingDispatcher, workflow_id: str, step_id: str) -> str | None:
    return dispatcher.carried.get(("step", f"{workflow_id}/{step_id}", 0))


def _row(settings: Settings, workflow_id: str, step_id: str) -> Any:
    with Backend.build(settings).engine.connect() as conn:
        return conn.execute(
            select(steps.c.status, steps.c.outputs, steps.c.revision, steps.c.last_task_id).where(
                steps.c.workflow_id == workflow_id, steps.c.step_id == step_id
            )
        ).one()


def _released(pg_settings: Settings, last: str = "total") -> tuple[WorkflowEngine, str, str]:
    """The diamond with a and b done: c released, its message's payload."""
    engine, dispatcher = _engine(pg_settings)
    workflow_id = _diamond(engine, last)
    assert engine.run_step(workflow_id, "a", 0, "t-a") == "success"
    assert _carried(dispatcher, workflow_id, "c") is None  # not released yet
    assert engine.run_step(workflow_id, "b", 0, "t-b") == "success"
    carried = _carried(dispatcher, workflow_id, "c")
    assert carried is not None
    return engine, workflow_id, carried


def _peeks(engine: WorkflowEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    peek = engine.store.peek

    def counted(workflow_id: str, step_id: str, revision: int) -> Any:
        calls.append(step_id)
        return peek(workflow_id, step_id, revision)

    monkeypatch.setattr(engine.store, "peek", counted)
    return calls


def test_the_released_step_runs_from_its_message_without_a_read(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, workflow_id, carried = _released(pg_settings)
    payload = codec.loads(carried)
    # The dependency committing with the release is in it, as committed.
    assert payload["dep_outputs"] == {"a": {"value": 1}, "b": {"value": 2}}
    assert payload["inputs"] == {"value": 10} and payload["dependents"] == []
    peeks = _peeks(engine, monkeypatch)
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=carried) == "success"
    assert peeks == []
    row = _row(pg_settings, workflow_id, "c")
    assert (row.status, codec.loads(row.outputs), row.revision) == ("success", {"value": 13}, 1)
    doc = engine.store.document(workflow_id)
    assert doc is not None and doc["status"] == "success"


@pytest.mark.parametrize(
    "forge",
    [
        lambda p: {**p, "inputs": {"value": 1000}},  # forged inputs
        lambda p: {**p, "dep_outputs": {"a": {"value": 1}, "b": {"value": 99}}},  # stale
        lambda p: {**p, "inputs": {"value": 10.0}},  # equal as a number, not as stored
        lambda p: {**p, "dependents": ["a"]},  # would count another step down
        lambda p: {**p, "action": "claimed_total"},
        lambda p: dict(reversed(p.items())),  # the same object, keys in another order
    ],
)
def test_a_forged_or_stale_payload_commits_nothing_and_the_step_is_read(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch, forge: Any
) -> None:
    engine, workflow_id, carried = _released(pg_settings)
    forged = codec.dumps(forge(codec.loads(carried)))
    peeks = _peeks(engine, monkeypatch)
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=forged) == "success"
    assert peeks == ["c"]
    row = _row(pg_settings, workflow_id, "c")
    # One commit, of what the stored step makes: 10 + 1 + 2.
    assert (row.status, codec.loads(row.outputs), row.revision) == ("success", {"value": 13}, 1)
    assert _row(pg_settings, workflow_id, "a").revision == 1  # not counted down, not moved


@pytest.mark.parametrize(
    "respell",
    [
        lambda text: text.replace('"value": 10}', '"value": 1e1}'),  # jsonb reads 10
        lambda text: text.replace('"value": 10}', '"value": 10 }'),
        lambda text: text.replace('{"value": 10}', '{"value": 10, "value": 10}'),
    ],
)
def test_the_payload_must_be_the_stores_own_text(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch, respell: Any
) -> None:
    """Equal as jsonb is not enough: the action reads the text (1e1 is a float)."""
    engine, workflow_id, carried = _released(pg_settings)
    respelled = respell(carried)
    assert respelled != carried and codec.loads(respelled)["inputs"] == {"value": 10}
    peeks = _peeks(engine, monkeypatch)
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=respelled) == "success"
    assert peeks == ["c"]
    assert codec.dumps(codec.loads(_row(pg_settings, workflow_id, "c").outputs)) == (
        '{"value":13}'  # an int, as the stored step makes it
    )


def test_a_reply_lost_after_the_commit_reaches_the_task(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit landed but its reply was lost: the error goes up (the task retries under
    its id, and the retry finds the leftovers), not into a second run from a read."""
    engine, dispatcher = _engine(pg_settings, HopPolicy.INLINE)
    spec = [
        {"step_id": f"s{i}", "action": "total"} | ({"dependencies": [f"s{i - 1}"]} if i else {})
        for i in range(3)
    ]
    workflow_id = engine.start(engine.validate({"steps": spec}, ACTIONS))
    succeed_carried = engine.store.succeed_carried

    def lost_reply(*args: Any) -> Any:
        succeed_carried(*args)
        raise ConnectionError("the connection dropped before the reply")

    monkeypatch.setattr(engine.store, "succeed_carried", lost_reply)
    with pytest.raises(ConnectionError):
        engine.run_step(workflow_id, "s0", 0, "t-1")
    assert _row(pg_settings, workflow_id, "s1").status == "success"
    monkeypatch.undo()
    # The task's retry, same id: the step is a leftover of this task, its release resent.
    dispatcher.sent.clear()
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "resumed"
    assert [args[1] for kind, args in dispatcher.sent if kind == "step"] == ["s2"]


@pytest.mark.parametrize(
    "raw",
    ["", "not json", "[]", '{"action": 1}', "{" * 5000, "x" * 40_000, '{"inputs": {}}'],
)
def test_a_malformed_payload_is_ignored(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    engine, workflow_id, _ = _released(pg_settings)
    peeks = _peeks(engine, monkeypatch)
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=raw) == "success"
    assert peeks == ["c"]
    assert codec.loads(_row(pg_settings, workflow_id, "c").outputs) == {"value": 13}


def test_a_duplicate_delivery_with_the_payload_commits_nothing(pg_settings: Settings) -> None:
    engine, workflow_id, carried = _released(pg_settings)
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=carried) == "success"
    assert engine.run_step(workflow_id, "c", 0, "t-dup", carried=carried) == "duplicate"
    row = _row(pg_settings, workflow_id, "c")
    assert (row.revision, row.last_task_id) == (1, "t-c")


def test_a_redelivery_reads_the_step_even_with_a_payload(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, workflow_id, carried = _released(pg_settings)
    peeks = _peeks(engine, monkeypatch)
    status = engine.run_step(workflow_id, "c", 0, "t-c", redelivered=True, carried=carried)
    assert status == "success" and peeks == []  # claimed (a redelivery is), not carried
    assert _row(pg_settings, workflow_id, "c").revision == 2  # the claim, then the success


def test_a_step_whose_action_is_not_quick_is_sent_plain_and_claimed(
    pg_settings: Settings,
) -> None:
    engine, dispatcher = _engine(pg_settings)
    workflow_id = _diamond(engine, "claimed_total")
    engine.run_step(workflow_id, "a", 0, "t-a")
    engine.run_step(workflow_id, "b", 0, "t-b")
    assert ("step", (workflow_id, "c", 0, 0.0)) in dispatcher.sent
    assert _carried(dispatcher, workflow_id, "c") is None  # it would be read with the claim
    forged = codec.dumps(
        {
            "action": "claimed_total",
            "inputs": {"value": 10},
            "dependencies": ["a", "b"],
            "dependents": [],
            "retry_count": 0,
            "max_retries": 3,
            "dep_outputs": {"a": {"value": 1}, "b": {"value": 2}},
        }
    )
    assert engine.run_step(workflow_id, "c", 0, "t-c", carried=forged) == "success"
    row = _row(pg_settings, workflow_id, "c")
    assert (codec.loads(row.outputs), row.revision) == ({"value": 13}, 2)  # claimed first


@pytest.mark.parametrize("extra", [{"approval": True}, {"not_before_s": 30}, {"timeout_s": 5}])
def test_a_step_that_needs_its_claim_is_not_carried(
    pg_settings: Settings, extra: dict[str, Any]
) -> None:
    engine, dispatcher = _engine(pg_settings)
    workflow_id = _diamond(engine, **extra)
    engine.run_step(workflow_id, "a", 0, "t-a")
    engine.run_step(workflow_id, "b", 0, "t-b")
    # One waiting for its approval is not sent at all until decided.
    sent = ("step", (workflow_id, "c", 0, 0.0)) in dispatcher.sent
    assert sent is not extra.get("approval", False)
    assert _carried(dispatcher, workflow_id, "c") is None


def test_a_chain_under_the_inline_policy_continues_without_reads(
    pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = _engine(pg_settings, HopPolicy.INLINE)
    spec = [
        {"step_id": f"s{i}", "action": "total", "inputs": {"value": 1}}
        | ({"dependencies": [f"s{i - 1}"]} if i else {})
        for i in range(5)
    ]
    workflow_id = engine.start(engine.validate({"steps": spec}, ACTIONS))
    peeks = _peeks(engine, monkeypatch)
    assert engine.run_step(workflow_id, "s0", 0, "t-1") == "success"
    assert peeks == ["s0"]  # the delivery's own step; the four it continued into carried
    assert codec.loads(_row(pg_settings, workflow_id, "s4").outputs) == {"value": 5}


def test_the_portable_store_carries_nothing(settings: Settings) -> None:
    engine, dispatcher = _engine(settings)
    workflow_id = _diamond(engine)
    engine.run_step(workflow_id, "a", 0, "t-a")
    engine.run_step(workflow_id, "b", 0, "t-b")
    assert (_carried(dispatcher, workflow_id, "c") is not None) == engine.store.verifies_carried


def test_carrying_off_sends_messages_an_older_worker_accepts(pg_settings: Settings) -> None:
    engine, dispatcher = _engine(pg_settings.model_copy(update={"carry_snapshot": False}))
    workflow_id = _diamond(engine)
    engine.run_step(workflow_id, "a", 0, "t-a")
    engine.run_step(workflow_id, "b", 0, "t-b")
    assert ("step", (workflow_id, "c", 0, 0.0)) in dispatcher.sent
    assert _carried(dispatcher, workflow_id, "c") is None
