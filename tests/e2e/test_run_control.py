"""Run control through real workers: idempotent submission, cancel a turn or a workflow,
retry from the failure, step timeouts, durable timers, a stable key for side effects,
and listing with cursors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from sqlalchemy import text

from config import Settings
from state.errors import (
    IdempotencyConflictError,
    NotFoundError,
    RunStateError,
    WorkflowSpecError,
)
from tasks.app import make_app
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.agents import release_key
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers

FLAKY_TWICE = {"name": "flaky", "failures": 2}


@pytest.fixture(scope="module")
def control_settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def client(
    control_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(control_settings, tmp_path_factory.mktemp("control"), count=2).start()
    yield AgentClient(control_settings)
    pool.stop()


@pytest.fixture
def effects(control_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(control_settings.redis_url, decode_responses=True)


def step(step_id: str, action: str, deps: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    inputs = extra.pop("inputs", {})
    return {"step_id": step_id, "action": action, "inputs": inputs, "dependencies": deps or []}


def wait_until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def kinds(doc: dict[str, Any]) -> list[str]:
    return [m["metadata"].get("kind", m["role"]) for m in doc["message_history"]]


# -- idempotent submission --------------------------------------------------------


def test_sixteen_racing_senders_with_one_key_make_one_message_and_one_turn(
    client: AgentClient,
) -> None:
    session_id, user = uid("s"), uid("u")
    ids: list[str] = []
    start = threading.Barrier(16)

    def send() -> None:
        start.wait()
        ids.append(
            client.send_message(session_id, "what is 4*5?", user_id=user, idempotency_key="k1")
        )

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 16 and len(set(ids)) == 1
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [m["role"] for m in doc["message_history"]] == ["user", "assistant"]
    assert doc["message_history"][-1]["content"] == "4*5 = 20"
    again = client.send_message(session_id, "what is 4*5?", user_id=user, idempotency_key="k1")
    assert again == ids[0]
    time.sleep(0.3)
    assert len(client.get_session(session_id)["message_history"]) == 2  # type: ignore[index]


def test_the_same_key_with_other_text_is_refused_and_changes_nothing(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello there", user_id=user, idempotency_key="k")
    client.wait_for_idle(session_id, timeout=30)
    with pytest.raises(IdempotencyConflictError, match="idempotency key"):
        client.send_message(session_id, "something else", user_id=user, idempotency_key="k")
    doc = client.get_session(session_id)
    assert doc is not None and len(doc["message_history"]) == 2 and doc["queued"] == 0


def test_a_workflow_started_twice_with_the_same_spec_runs_once(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    spec = {"workflow_id": uid("wf"), "context": {"run": run}, "steps": [step("a", "count")]}
    spec["steps"][0]["inputs"] = {"name": "a"}
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(client.start_workflow(dict(spec))))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [spec["workflow_id"]] * 8
    client.wait_for_workflow(spec["workflow_id"], timeout=30)
    assert client.start_workflow(spec) == spec["workflow_id"]
    time.sleep(0.3)
    assert effects.hgetall(effects_key(run)) == {"a": "1"}
    other = {**spec, "steps": [step("b", "echo")]}
    with pytest.raises(IdempotencyConflictError) as info:
        client.start_workflow(other)
    assert isinstance(info.value, WorkflowSpecError)


# -- cancelling a turn ------------------------------------------------------------


def test_cancel_turn_ends_a_running_handler_and_refuses_its_result(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "linger, what is 2+2?", user_id=user)
    wait_until(lambda: client.get_session(session_id)["phase"] == "executing")  # type: ignore[index]
    client.send_message(session_id, "what is 3+3?", user_id=user)  # queued behind it
    assert client.cancel_turn(session_id) is True
    cancelled = client.get_session(session_id)
    assert cancelled is not None and cancelled["phase"] != "executing"
    doc = client.wait_for_idle(session_id, timeout=30)
    assert kinds(doc) == ["user", "cancelled", "user", "assistant"]
    assert doc["message_history"][-1]["content"] == "3+3 = 6"
    time.sleep(2.5)  # the lingering handler returns and tries to commit
    after = client.get_session(session_id)
    assert after is not None and kinds(after) == kinds(doc) and after["phase"] == "idle"


def test_cancel_turn_with_nothing_running_is_false(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    assert client.cancel_turn(session_id) is False
    with pytest.raises(NotFoundError):
        client.cancel_turn(uid("nobody"))


def test_cancel_turn_cancels_the_workflow_it_waits_on(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "slowflow please", user_id=user)

    def waiting() -> bool:
        doc = client.get_session(session_id)
        return bool(doc and (doc.get("context_window") or {}).get("workflow_id"))

    wait_until(waiting)
    doc = client.get_session(session_id)
    workflow_id = doc["context_window"]["workflow_id"]  # type: ignore[index]
    assert client.cancel_turn(session_id) is True
    workflow = client.get_workflow(workflow_id)
    assert workflow is not None and workflow["status"] == "cancelled"
    assert workflow["steps"]["slow"]["status"] == "skipped"
    assert workflow["steps"]["slow"]["error"] == "cancelled"
    assert kinds(client.wait_for_idle(session_id, timeout=30)) == ["user", "cancelled"]


def test_cancels_racing_turns_leave_one_reply_per_message(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    for n in range(8):
        client.send_message(session_id, f"what is {n}+1?", user_id=user)
        time.sleep(0.005 * n)
        client.cancel_turn(session_id)
    doc = client.wait_for_idle(session_id, timeout=60)
    roles = [m["role"] for m in doc["message_history"]]
    assert roles == ["user", "assistant"] * 8
    replies = [m["metadata"].get("reply_to") for m in doc["message_history"][1::2]]
    asked = [m["metadata"].get("message_id") for m in doc["message_history"][0::2]]
    assert replies == asked


# -- cancelling and retrying workflows ----------------------------------------------


def test_cancel_workflow_skips_what_is_left_and_discards_a_late_result(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    gate_step = step("g", "gate", inputs={"name": "g", "seconds": 10})
    after = step("after", "count", ["g"], inputs={"name": "after"})
    workflow_id = client.start_workflow({"context": {"run": run}, "steps": [gate_step, after]})
    wait_until(lambda: effects.hget(effects_key(run), "g:started") == "1")
    doc = client.cancel_workflow(workflow_id)
    assert doc["status"] == "cancelled"
    assert {s: (v["status"], v["error"]) for s, v in doc["steps"].items()} == {
        "g": ("skipped", "cancelled"),
        "after": ("skipped", "cancelled"),
    }
    effects.set(f"{effects_key(run)}:open", 1)  # the running action finishes now
    wait_until(lambda: effects.hget(effects_key(run), "g") == "1")
    time.sleep(0.5)
    final = client.get_workflow(workflow_id)
    assert final is not None and final["status"] == "cancelled"
    assert final["steps"]["g"]["outputs"] == {} and effects.hget(effects_key(run), "after") is None
    with pytest.raises(RunStateError, match="cancelled"):
        client.cancel_workflow(workflow_id)
    with pytest.raises(NotFoundError):
        client.cancel_workflow(uid("wf"))


def test_retry_runs_a_failed_workflow_from_the_failure(
    client: AgentClient, effects: redis.Redis, control_settings: Settings
) -> None:
    run = uid("run")
    workflow_id = client.start_workflow(
        {
            "context": {"run": run},
            "steps": [
                step("first", "count", inputs={"name": "first"}),
                {
                    **step(
                        "flaky", "record_key", ["first"], inputs={"name": "flaky", "failures": 2}
                    ),
                    "max_retries": 1,
                },
                step("last", "count", ["flaky"], inputs={"name": "last"}),
            ],
        }
    )
    failed = client.wait_for_workflow(workflow_id, timeout=30)
    assert failed["status"] == "failed"
    assert failed["steps"]["last"]["status"] == "skipped"
    with pytest.raises(RunStateError):
        client.cancel_workflow(workflow_id)
    old_revision_task = ("agentstate.workflow.step", [workflow_id, "flaky", 1])
    doc = client.retry_workflow(workflow_id)
    assert doc["status"] == "running"
    assert (
        doc["steps"]["flaky"]["retry_count"] == 0 and doc["steps"]["first"]["status"] == "success"
    )
    make_app(control_settings).send_task(old_revision_task[0], args=old_revision_task[1])
    done = client.wait_for_workflow(workflow_id, timeout=30)
    assert done["status"] == "success"
    counts = effects.hgetall(effects_key(run))
    assert counts["first"] == "1" and counts["last"] == "1" and counts["flaky:attempts"] == "3"
    keys = set(effects.lrange(f"{effects_key(run)}:keys", 0, -1))
    assert keys == {f"{workflow_id}:flaky"}  # the same key on every attempt
    with pytest.raises(RunStateError, match="success"):
        client.retry_workflow(workflow_id)


# -- step timeouts and durable timers -------------------------------------------------


def test_a_step_over_its_timeout_is_a_failed_attempt(client: AgentClient) -> None:
    slow = {**step("slow", "sleep", inputs={"seconds": 3}), "timeout_s": 0.5, "max_retries": 1}
    workflow_id = client.start_workflow({"steps": [slow]})
    started = time.monotonic()
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    assert doc["status"] == "failed"
    assert doc["steps"]["slow"]["retry_count"] == 1
    assert "timed out" in doc["steps"]["slow"]["error"]
    assert time.monotonic() - started < 6.0  # two attempts of 0.5 s, not 3 s each


def test_a_timer_step_starts_no_sooner_than_not_before_s(client: AgentClient) -> None:
    timed = {**step("later", "echo", inputs={"x": 1}), "not_before_s": 1.5}
    workflow_id = client.start_workflow({"steps": [step("now", "echo"), timed]})
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    assert doc["status"] == "success"
    created = datetime.fromisoformat(doc["created_at"])
    started = datetime.fromisoformat(doc["steps"]["later"]["started_at"])
    assert (started - created).total_seconds() >= 1.5
    assert doc["steps"]["later"]["outputs"] == {"x": 1}


# -- listing ---------------------------------------------------------------------------


def test_sessions_and_workflows_page_newest_first(client: AgentClient) -> None:
    user = uid("u")
    made = []
    for n in range(5):
        session_id = uid("s")
        client.send_message(session_id, f"what is {n}+{n}?", user_id=user)
        made.append(session_id)
    seen: list[str] = []
    cursor = None
    while True:
        page = client.list_sessions(user_id=user, limit=2, cursor=cursor)
        seen += [item["session_id"] for item in page["items"]]
        assert len(page["items"]) <= 2
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1]
    for session_id in made:
        client.wait_for_idle(session_id, timeout=30)
    idle = client.list_sessions(user_id=user, phase="idle", limit=50)
    assert {i["session_id"] for i in idle["items"]} == set(made)
    workflow_id = client.start_workflow({"steps": [step("a", "echo")]})
    client.wait_for_workflow(workflow_id, timeout=30)
    latest = client.list_workflows(status="success", limit=1)
    assert latest["items"][0]["workflow_id"] == workflow_id and latest["next_cursor"]
    with pytest.raises(Exception, match="cursor"):
        client.list_workflows(cursor="not-a-cursor")
    with pytest.raises(Exception, match="limit"):
        client.list_sessions(limit=0)


def test_listing_by_user_is_an_index_scan(client: AgentClient) -> None:
    with client.backend.engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        plan = conn.execute(
            text(
                "EXPLAIN SELECT session_id FROM sessions WHERE user_id = 'u' "
                "ORDER BY created_at DESC, session_id DESC LIMIT 51"
            )
        ).all()
    assert "ix_sessions_user_created" in " ".join(str(r[0]) for r in plan)


# -- the command line ----------------------------------------------------------------


def test_the_cli_cancels_retries_and_lists(
    client: AgentClient, control_settings: Settings, effects: redis.Redis
) -> None:
    from tests.e2e.test_cli import assert_one_line_error, run

    session_id, user = uid("s"), uid("u")
    # Held until released: the command's start (seconds on a busy machine) cannot outlast it.
    client.send_message(session_id, "hold, what is 1+1?", user_id=user)
    wait_until(lambda: client.get_session(session_id)["phase"] == "executing")  # type: ignore[index]
    cancelled = run(control_settings, "session", "cancel", session_id, "--json")
    effects.set(release_key(session_id), 1)
    assert cancelled.returncode == 0 and '"cancelled": true' in cancelled.stdout
    again = run(control_settings, "session", "cancel", session_id)
    assert again.returncode == 0 and "no turn was running" in again.stdout
    listed = run(control_settings, "session", "list", "--user", user, "--json")
    assert session_id in listed.stdout and '"next_cursor": null' in listed.stdout
    run_id = uid("run")
    spec = {"context": {"run": run_id}, "steps": [step("g", "gate", inputs={"name": "g"})]}
    workflow_id = client.start_workflow(spec)
    wait_until(lambda: effects.hget(effects_key(run_id), "g:started") == "1")
    assert "cancelled" in run(control_settings, "workflow", "cancel", workflow_id).stdout
    retried = run(control_settings, "workflow", "retry", workflow_id, "--json")
    # Opened after the retry's answer: a fast worker cannot have finished it by then.
    effects.set(f"{effects_key(run_id)}:open", 1)
    assert retried.returncode == 0 and '"status": "running"' in retried.stdout
    assert client.wait_for_workflow(workflow_id, timeout=30)["status"] == "success"
    listed = run(control_settings, "workflow", "list", "--status", "success", "--limit", "5")
    assert workflow_id in listed.stdout
    missing = run(control_settings, "workflow", "cancel", uid("wf"))
    assert_one_line_error(missing, 2, "unknown workflow")
    finished = run(control_settings, "workflow", "retry", workflow_id)
    assert_one_line_error(finished, 2, "success")
    unknown = run(control_settings, "session", "cancel", uid("nobody"))
    assert_one_line_error(unknown, 2, "unknown session")
