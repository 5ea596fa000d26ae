"""Workflows through real workers: dependencies, retries, failure propagation, exactly once."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis
from sqlalchemy import select

from config import Settings
from state.errors import WorkflowSpecError
from state.storage import keys
from state.storage.db import get_engine
from state.storage.tables import steps
from tasks.app import make_app
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.support import Workers, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


@pytest.fixture
def effects(worker_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(worker_settings.redis_url, decode_responses=True)


def step(step_id: str, action: str, deps: list[str] | None = None, **inputs: Any) -> dict[str, Any]:
    return {"step_id": step_id, "action": action, "inputs": inputs, "dependencies": deps or []}


def counted(step_id: str, deps: list[str] | None = None) -> dict[str, Any]:
    return step(step_id, "count", deps, name=step_id)


def test_diamond_computes_through_dependency_outputs(client: AgentClient) -> None:
    workflow_id = client.start_workflow(
        {
            "steps": [
                step("a", "calculate", expression="6*7"),
                step("b", "calculate", ["a"], expression="a+8"),
                step("c", "calculate", ["a"], expression="a-2"),
                step("d", "calculate", ["b", "c"], expression="b*c"),
            ]
        }
    )
    doc = client.wait_for_workflow(workflow_id, timeout=60)
    assert doc["status"] == "success"
    assert {s: doc["steps"][s]["outputs"]["value"] for s in "abcd"} == {
        "a": 42,
        "b": 50,
        "c": 40,
        "d": 2000,
    }


def test_forty_wide_fan_out_and_fan_in(client: AgentClient, effects: redis.Redis) -> None:
    run = uid("run")
    middle = [counted(f"m{i}", ["root"]) for i in range(40)]
    spec = {
        "context": {"run": run},
        "steps": [counted("root"), *middle, counted("sink", [m["step_id"] for m in middle])],
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=120)
    assert doc["status"] == "success"
    # every middle step saw root's output (1), the sink saw all forty of them
    assert doc["steps"]["sink"]["outputs"]["value"] == 1 + 40 * 2
    counts = effects.hgetall(effects_key(run))
    assert len(counts) == 42 and set(counts.values()) == {"1"}


def test_layered_thousand_step_dag_runs_each_step_exactly_once(
    client: AgentClient, effects: redis.Redis, worker_settings: Settings, record_property: Any
) -> None:
    run, layers, width = uid("run"), 10, 100
    steps = []
    for layer in range(layers):
        for i in range(width):
            deps = [] if layer == 0 else [f"L{layer - 1}-{i}", f"L{layer - 1}-{(i + 1) % width}"]
            steps.append(counted(f"L{layer}-{i}", deps))
    started = time.perf_counter()
    workflow_id = client.start_workflow({"context": {"run": run}, "steps": steps})
    doc = client.wait_for_workflow(workflow_id, timeout=300)
    dag_s = time.perf_counter() - started
    assert doc["status"] == "success"
    counts = effects.hgetall(effects_key(run))
    assert len(counts) == 1000 and set(counts.values()) == {"1"}
    assert all(s["retry_count"] == 0 for s in doc["steps"].values())

    bare_s = _bare_tasks(worker_settings, effects, 1000)
    record_property("dag_steps_per_second", round(1000 / dag_s, 1))
    record_property("bare_tasks_per_second", round(1000 / bare_s, 1))
    print(
        f"\n1,000-step DAG: {dag_s:.2f}s ({1000 / dag_s:.0f} steps/s); 1,000 bare Celery "
        f"tasks on the same workers: {bare_s:.2f}s ({1000 / bare_s:.0f} tasks/s); "
        f"ratio {dag_s / bare_s:.2f}x"
    )


def _bare_tasks(settings: Settings, effects: redis.Redis, count: int) -> float:
    app = make_app(settings)
    key = f"test:bare:{uid('k')}"
    started = time.perf_counter()
    for _ in range(count):
        app.send_task("agentstate.baseline.noop", args=[key])
    deadline = time.monotonic() + 120
    while int(effects.get(keys.baseline_counter(key)) or 0) < count:
        assert time.monotonic() < deadline, "bare tasks did not finish"
        time.sleep(0.01)
    return time.perf_counter() - started


def test_a_step_failing_twice_then_succeeding(client: AgentClient) -> None:
    run = uid("run")
    spec = {
        "context": {"run": run},
        "steps": [
            step("flaky", "flaky", name="flaky", failures=2) | {"max_retries": 3},
            counted("after", ["flaky"]),
        ],
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    assert doc["status"] == "success"
    assert doc["steps"]["flaky"]["retry_count"] == 2
    assert doc["steps"]["flaky"]["outputs"] == {"attempts": 3}


def test_a_step_failing_for_good_skips_dependents_only(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    spec = {
        "context": {"run": run},
        "steps": [
            counted("start"),
            step("doomed", "fail", ["start"], message="no luck", retryable=True)
            | {"max_retries": 2},
            counted("child", ["doomed"]),
            counted("grandchild", ["child"]),
            counted("branch", ["start"]),
            counted("branch2", ["branch"]),
        ],
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    statuses = {sid: s["status"] for sid, s in doc["steps"].items()}
    assert statuses == {
        "start": "success",
        "doomed": "failed",
        "child": "skipped",
        "grandchild": "skipped",
        "branch": "success",
        "branch2": "success",
    }
    assert doc["status"] == "failed"
    assert doc["steps"]["doomed"]["retry_count"] == 2  # max_retries 2: three attempts
    assert "no luck" in doc["steps"]["doomed"]["error"]
    counts = effects.hgetall(effects_key(run))
    assert counts == {"start": "1", "branch": "1", "branch2": "1"}  # no success re-run


def test_an_error_no_retry_can_fix_fails_its_step_at_once(client: AgentClient) -> None:
    spec = {
        "steps": [
            step("divide", "calculate", expression="1/0") | {"max_retries": 3},
            step("after", "echo", ["divide"]),
            step("give_up", "fail", message="card declined") | {"max_retries": 3},
            step("nap", "sleep", seconds="a while") | {"max_retries": 3},
            step("fine", "calculate", expression="6*7") | {"max_retries": 3},
        ]
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    steps = doc["steps"]
    assert {sid: s["status"] for sid, s in steps.items()} == {
        "divide": "failed",
        "after": "skipped",
        "give_up": "failed",
        "nap": "failed",
        "fine": "success",
    }
    assert [steps[s]["retry_count"] for s in ("divide", "give_up", "nap")] == [0, 0, 0]
    assert steps["divide"]["error"] == "CalculationError: division by zero"
    assert steps["give_up"]["error"] == "PermanentActionError: card declined"
    assert steps["nap"]["error"] == "PermanentActionError: seconds must be a number, not str"
    assert doc["status"] == "failed"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"steps": []}, "non-empty"),
        ({"steps": [step("a", "no-such-action")]}, "unknown action"),
        ({"steps": [step("a", "echo", ["ghost"])]}, "not a step"),
        ({"steps": [step("a", "echo"), step("a", "echo")]}, "duplicate"),
        (
            {
                "steps": [
                    step("a", "echo", ["c"]),
                    step("b", "echo", ["a"]),
                    step("c", "echo", ["b"]),
                ]
            },
            "a -> b -> c -> a",
        ),
        ({"steps": [step("bad id", "echo")]}, "invalid step id"),
        ({"steps": [step(f"s{i}", "echo") for i in range(10_001)]}, "limit is 10000"),
        ({"steps": [step("a", "echo")], "context": []}, "context"),
        (
            {"steps": [step("a", "echo"), {"step_id": "b", "action": "echo", "depends_on": ["a"]}]},
            r"step 'b': unknown key 'depends_on' \(did you mean 'dependencies'\?\)",
        ),
        ({"step": [step("a", "echo")]}, r"unknown key 'step' \(did you mean 'steps'\?\)"),
        ({"steps": [step("a", "echo") | {"timeout_s": "soon"}]}, "'timeout_s' must be a number"),
        ("not even a dict", "JSON object"),
    ],
)
def test_invalid_specs_are_refused_and_store_nothing(
    client: AgentClient, spec: Any, words: str
) -> None:
    workflow_id = uid("bad")
    if isinstance(spec, dict):
        spec = {**spec, "workflow_id": workflow_id}
    with pytest.raises(WorkflowSpecError, match=words):
        client.start_workflow(spec)
    assert client.get_workflow(workflow_id) is None


def test_a_workflow_id_cannot_be_reused(client: AgentClient) -> None:
    workflow_id = uid("wf")
    client.wait_for_workflow(
        client.start_workflow({"workflow_id": workflow_id, "steps": [step("a", "echo")]}),
        timeout=30,
    )
    with pytest.raises(WorkflowSpecError, match="already exists"):
        client.start_workflow({"workflow_id": workflow_id, "steps": [step("z", "echo")]})
    doc = client.get_workflow(workflow_id)
    assert doc is not None and list(doc["steps"]) == ["a"]


def test_the_same_step_task_delivered_twice_has_one_side_effect(
    client: AgentClient, effects: redis.Redis, worker_settings: Settings
) -> None:
    run = uid("run")
    workflow_id = client.start_workflow(
        {"context": {"run": run}, "steps": [step("slow", "slow_count", name="slow", seconds=0.5)]}
    )
    app = make_app(worker_settings)
    for _ in range(3):  # redeliveries of the root's message, while the first one runs
        app.send_task("agentstate.workflow.step", args=[workflow_id, "slow", 0])
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    time.sleep(1.0)  # let every duplicate be processed
    assert doc["status"] == "success"
    assert effects.hgetall(effects_key(run)) == {"slow": "1"}


def test_quick_steps_commit_once_and_never_show_running(
    client: AgentClient, effects: redis.Redis, worker_settings: Settings
) -> None:
    """A quick action's step is not claimed: pending -> success in one commit (revision
    0 -> 1); eight deliveries of the root at once commit it once and release its
    dependent once."""
    run = uid("run")
    spec = {
        "context": {"run": run},
        "steps": [
            step("root", "quick_count", name="root"),
            step("leaf", "quick_count", ["root"], name="leaf"),
        ],
    }
    app = make_app(worker_settings)
    workflow_id = client.start_workflow(spec)
    for _ in range(8):
        app.send_task("agentstate.workflow.step", args=[workflow_id, "root", 0])
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    time.sleep(1.0)  # let every duplicate be processed
    assert doc["status"] == "success"
    assert doc["steps"]["leaf"]["outputs"] == {"value": 2}
    runs = effects.hgetall(effects_key(run))
    assert int(runs["root"]) >= 1  # duplicates may run it; only one commit counts
    assert int(runs["leaf"]) >= 1  # a quick action runs at least once; it commits once
    with get_engine(worker_settings.database_url).connect() as conn:
        rows = conn.execute(
            select(steps.c.step_id, steps.c.revision).where(steps.c.workflow_id == workflow_id)
        )
        assert {row.step_id: row.revision for row in rows} == {"root": 1, "leaf": 1}


def test_a_failing_quick_step_is_retried_and_counted_like_any_other(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    retried = client.start_workflow(
        {"context": {"run": run}, "steps": [step("q", "quick_count", name="q", failures=2)]}
    )
    doc = client.wait_for_workflow(retried, timeout=60)
    assert doc["status"] == "success"
    # Each failed attempt is counted once (a run repeated by a redelivery, which a quick
    # action allows, fails again within the same attempt).
    assert 1 <= doc["steps"]["q"]["retry_count"] <= 2
    given_up = client.start_workflow(
        {
            "context": {"run": run},
            "steps": [
                {**step("g", "quick_count", name="g", failures=9), "max_retries": 1},
                step("after", "quick_count", ["g"], name="after"),
            ],
        }
    )
    doc = client.wait_for_workflow(given_up, timeout=60)
    assert doc["status"] == "failed"
    assert doc["steps"]["g"]["status"] == "failed" and doc["steps"]["g"]["retry_count"] == 1
    assert re.fullmatch(r"RuntimeError: quick failure \d+", doc["steps"]["g"]["error"])
    assert doc["steps"]["after"]["status"] == "skipped"
    assert int(effects.hget(effects_key(run), "g") or 0) >= 2  # at least one run per attempt
