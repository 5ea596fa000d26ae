"""Human approval through real workers and a real beat: a turn and a workflow step wait for
a person's decision; approved, the action runs once; rejected, it never runs; racing
deciders, one wins; undecided, beat rejects it as expired; decided while Redis is flushed.

The workers' Redis (cache, locks, pushes) is a private redis-server, so that FLUSHALL
touches nothing but this module.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import update

from config import Settings
from state.errors import ApprovalAlreadyDecidedError, InvalidPayloadError, NotFoundError
from state.storage.db import get_engine
from state.storage.tables import approvals
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.agents import risky_key
from tests.e2e.test_cli import assert_one_line_error, run
from tests.services import Beat, PrivateRedis
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def approval_settings(pg_url: str, private_redis: PrivateRedis) -> Settings:
    return agent_test_settings(pg_url, redis_url=f"{private_redis.url}/0", sweep_interval=1.0)


@pytest.fixture(scope="module")
def client(
    approval_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    log_dir: Path = tmp_path_factory.mktemp("approvals")
    pool = Workers(approval_settings, log_dir, count=2).start()
    beat = Beat(approval_settings, log_dir).start()
    yield AgentClient(approval_settings)
    beat.stop()
    pool.stop()


@pytest.fixture
def effects(approval_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(approval_settings.redis_url, decode_responses=True)


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def ask(client: AgentClient, text: str, user: str) -> tuple[str, dict[str, Any]]:
    """Send ``text``; return the session once it waits, and its one pending approval."""
    session_id = uid("s")
    client.send_message(session_id, text, user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "awaiting_approval"
    pending = [a for a in client.approvals(user_id=user) if a["session_id"] == session_id]
    assert len(pending) == 1
    return session_id, pending[0]


def replies(doc: dict[str, Any]) -> list[str]:
    return [m["content"] for m in doc["message_history"] if m["role"] == "assistant"]


def event_kinds(client: AgentClient, session_id: str) -> list[str]:
    return [e["kind"] for e in client.events(session_id)]


def remember_two(client: AgentClient, user: str) -> None:
    session_id = uid("s")
    for fact in ("the door code is 4711", "my cat is called Ada"):
        client.send_message(session_id, f"remember that {fact}", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    assert len(client.load_user_state(user)["memories"]) == 2


# -- a turn ------------------------------------------------------------------------


def test_forget_everything_waits_for_approval_then_forgets_once(client: AgentClient) -> None:
    user = uid("u")
    remember_two(client, user)
    session_id, approval = ask(client, "forget everything", user)
    assert approval["action"] == "forget_memories"
    assert approval["args"] == {"memories": 2}
    assert approval["decision"] is None and approval["by"] is None
    expires = datetime.fromisoformat(approval["expires_at"])
    assert timedelta(hours=23) < expires - datetime.now(UTC) <= timedelta(hours=24)
    assert client.load_user_state(user)["memories"]  # nothing forgotten before the decision
    assert client.get_session(session_id)["message_history"][-1]["role"] == "user"

    decided = client.decide(approval["approval_id"], True, by="alice", note="asked by phone")
    assert (decided["decision"], decided["approved"], decided["by"]) == ("approved", True, "alice")
    assert decided["note"] == "asked by phone" and decided["decided_at"]

    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle"
    assert replies(doc) == ["Done: I have forgotten everything I remembered for you."]
    assert client.load_user_state(user)["memories"] == []
    path = doc["metadata"]["turn"]["path"]
    assert path[path.index("awaiting_approval") + 1] == "executing"
    kinds = event_kinds(client, session_id)
    assert kinds.count("approval_requested") == 1 and kinds.count("approval_decided") == 1
    assert kinds.index("approval_requested") < kinds.index("approval_decided")
    assert client.approvals(user_id=user) == []
    (kept,) = client.approvals(user_id=user, pending=False)
    assert (kept["by"], kept["note"], kept["decision"]) == ("alice", "asked by phone", "approved")


def test_a_rejected_forget_keeps_the_memories_and_says_so(client: AgentClient) -> None:
    user = uid("u")
    remember_two(client, user)
    session_id, approval = ask(client, "please forget everything", user)
    client.decide(approval["approval_id"], False, by="bob")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle"
    assert "kept" in replies(doc)[-1]
    assert len(client.load_user_state(user)["memories"]) == 2
    path = doc["metadata"]["turn"]["path"]
    assert path[path.index("awaiting_approval") + 1] == "generating"  # executing never ran


def test_eight_racing_deciders_one_wins(client: AgentClient, effects: redis.Redis) -> None:
    user = uid("u")
    session_id, approval = ask(client, "risky business", user)
    start = threading.Barrier(8)
    won: list[dict[str, Any]] = []
    refused: list[str] = []

    def decide(i: int) -> None:
        start.wait()
        try:
            won.append(client.decide(approval["approval_id"], i % 2 == 0, by=f"person-{i}"))
        except ApprovalAlreadyDecidedError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7
    winner = won[0]
    assert all(winner["by"] in message for message in refused)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert len(replies(doc)) == 1
    runs = int(effects.get(risky_key(session_id)) or 0)
    assert runs == (1 if winner["approved"] else 0)
    assert event_kinds(client, session_id).count("approval_decided") == 1
    with pytest.raises(ApprovalAlreadyDecidedError):
        client.decide(approval["approval_id"], True, by="late")


def test_an_undecided_turn_approval_is_rejected_by_beat_when_it_expires(
    client: AgentClient, effects: redis.Redis
) -> None:
    user = uid("u")
    session_id, approval = ask(client, "risky but hasty", user)
    decided = wait_until(
        lambda: [a for a in client.approvals(user, pending=False) if a["decision"]], timeout=15
    )[0]
    assert (decided["approval_id"], decided["decision"], decided["by"]) == (
        approval["approval_id"],
        "rejected",
        "expired",
    )
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle" and len(replies(doc)) == 1
    assert effects.get(risky_key(session_id)) is None  # the action never ran
    with pytest.raises(ApprovalAlreadyDecidedError, match="expired"):
        client.decide(approval["approval_id"], True, by="too-late")


def test_an_approval_decided_while_redis_is_flushed_still_resumes_the_turn(
    client: AgentClient, private_redis: PrivateRedis
) -> None:
    user = uid("u")
    session_id, approval = ask(client, "risky again", user)
    private_redis.flushall()  # cache, locks and pushes gone; the approval is in Postgres
    client.decide(approval["approval_id"], True, by="carol")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle" and len(replies(doc)) == 1
    assert client.load_user_state(user)["risky_runs"] == 1


def test_cancelling_a_waiting_turn_closes_its_approval(client: AgentClient) -> None:
    user = uid("u")
    session_id, approval = ask(client, "risky to cancel", user)
    assert client.cancel_turn(session_id) is True
    assert client.approvals(user_id=user) == []
    with pytest.raises(ApprovalAlreadyDecidedError, match="cancelled"):
        client.decide(approval["approval_id"], True, by="dave")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["metadata"]["kind"] == "cancelled"


def test_a_message_sent_while_a_turn_waits_runs_after_the_decision(client: AgentClient) -> None:
    user = uid("u")
    session_id, approval = ask(client, "risky first", user)
    client.send_message(session_id, "what is 6*7?", user_id=user)
    time.sleep(0.5)
    assert client.get_session(session_id)["phase"] == "awaiting_approval"
    client.decide(approval["approval_id"], False, by="erin")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [m["role"] for m in doc["message_history"]] == ["user", "assistant"] * 2
    assert replies(doc)[-1] == "6*7 = 42"


# -- a workflow step ---------------------------------------------------------------


def gated_spec(run: str) -> dict[str, Any]:
    return {
        "context": {"run": run},
        "steps": [
            {"step_id": "prepare", "action": "count", "inputs": {"name": "prepare"}},
            {
                "step_id": "pay",
                "action": "count",
                "inputs": {"name": "pay"},
                "dependencies": ["prepare"],
                "approval": True,
            },
            {
                "step_id": "receipt",
                "action": "count",
                "inputs": {"name": "receipt"},
                "dependencies": ["pay"],
            },
        ],
    }


def step_approval(client: AgentClient, workflow_id: str) -> dict[str, Any]:
    found = [a for a in client.approvals() if a["workflow_id"] == workflow_id]
    assert len(found) == 1
    return found[0]


def test_an_approved_step_runs_once_and_its_dependents_after_it(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    workflow_id = client.start_workflow(gated_spec(run))
    approval = step_approval(client, workflow_id)
    assert (approval["step_id"], approval["action"]) == ("pay", "count")
    assert approval["args"] == {"name": "pay"}
    wait_until(lambda: client.get_workflow(workflow_id)["steps"]["prepare"]["status"] == "success")
    time.sleep(0.5)  # the gated step was dispatched and did not run
    steps = client.get_workflow(workflow_id)["steps"]
    assert steps["pay"]["status"] == "pending" and steps["pay"]["awaiting_approval"] is True
    assert steps["receipt"]["status"] == "pending"
    assert effects.hgetall(effects_key(run)) == {"prepare": "1"}

    client.decide(approval["approval_id"], True, by="frank")
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    assert doc["status"] == "success"
    assert doc["steps"]["pay"]["awaiting_approval"] is False
    assert effects.hgetall(effects_key(run)) == {"prepare": "1", "pay": "1", "receipt": "1"}


def test_a_rejected_step_fails_and_its_dependents_are_skipped(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    workflow_id = client.start_workflow(gated_spec(run))
    approval = step_approval(client, workflow_id)
    client.decide(approval["approval_id"], False, by="grace", note="too expensive")
    doc = client.wait_for_workflow(workflow_id, timeout=30)
    assert doc["status"] == "failed"
    assert (doc["steps"]["pay"]["status"], doc["steps"]["pay"]["error"]) == ("failed", "rejected")
    assert doc["steps"]["receipt"]["status"] == "skipped"
    assert "pay" not in effects.hgetall(effects_key(run))


def test_an_expired_step_approval_fails_the_step(
    client: AgentClient, approval_settings: Settings
) -> None:
    workflow_id = client.start_workflow(gated_spec(uid("run")))
    approval = step_approval(client, workflow_id)
    with get_engine(approval_settings.database_url).begin() as conn:
        conn.execute(
            update(approvals)
            .where(approvals.c.approval_id == approval["approval_id"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    doc = client.wait_for_workflow(workflow_id, timeout=30)  # beat runs every second
    assert (doc["status"], doc["steps"]["pay"]["error"]) == ("failed", "rejected")
    (decided,) = [a for a in client.approvals(pending=False) if a["workflow_id"] == workflow_id]
    assert decided["by"] == "expired"


def test_a_cancelled_workflow_closes_its_approvals(client: AgentClient) -> None:
    workflow_id = client.start_workflow(gated_spec(uid("run")))
    approval = step_approval(client, workflow_id)
    client.cancel_workflow(workflow_id)
    assert [a for a in client.approvals() if a["workflow_id"] == workflow_id] == []
    with pytest.raises(ApprovalAlreadyDecidedError):
        client.decide(approval["approval_id"], True, by="heidi")


def test_bad_decisions_are_refused_and_change_nothing(client: AgentClient) -> None:
    user = uid("u")
    _session_id, approval = ask(client, "risky to refuse", user)
    approval_id = approval["approval_id"]
    with pytest.raises(NotFoundError):
        client.decide("apr-nothing", True, by="ivan")
    for by in ("", "   ", "expired", "x" * 129):
        with pytest.raises(InvalidPayloadError):
            client.decide(approval_id, True, by=by)
    with pytest.raises(InvalidPayloadError):
        client.decide(approval_id, "yes", by="ivan")  # type: ignore[arg-type]
    assert client.approvals(user_id=user)[0]["decision"] is None


def test_a_retried_workflow_asks_again_for_the_step_that_was_rejected(
    client: AgentClient, effects: redis.Redis
) -> None:
    run = uid("run")
    workflow_id = client.start_workflow(gated_spec(run))
    first = step_approval(client, workflow_id)
    client.decide(first["approval_id"], False, by="judy")
    assert client.wait_for_workflow(workflow_id, timeout=30)["status"] == "failed"
    client.retry_workflow(workflow_id)
    second = step_approval(client, workflow_id)
    assert second["approval_id"] != first["approval_id"] and second["step_id"] == "pay"
    client.decide(second["approval_id"], True, by="judy")
    assert client.wait_for_workflow(workflow_id, timeout=30)["status"] == "success"
    assert effects.hgetall(effects_key(run)) == {"prepare": "1", "pay": "1", "receipt": "1"}


# -- the command line ----------------------------------------------------------------


def test_the_cli_lists_approves_and_refuses_a_second_decision(
    client: AgentClient, approval_settings: Settings
) -> None:
    user = uid("u")
    remember_two(client, user)
    session_id, approval = ask(client, "forget everything", user)
    approval_id = approval["approval_id"]
    listed = run(approval_settings, "approval", "list", "--user", user)
    assert listed.returncode == 0 and approval_id in listed.stdout
    assert "forget_memories" in listed.stdout
    as_json = json.loads(run(approval_settings, "approval", "list", "--json").stdout)
    assert approval_id in {a["approval_id"] for a in as_json}

    approved = run(
        approval_settings, "approval", "approve", approval_id, "--by", "kim", "--note", "ok"
    )
    assert approved.returncode == 0, approved.stderr
    assert f"{approval_id} approved by kim" in approved.stdout
    again = run(approval_settings, "approval", "reject", approval_id, "--by", "lee")
    assert_one_line_error(again, 2, "already approved", "kim")
    missing = run(approval_settings, "approval", "approve", "apr-none", "--by", "kim")
    assert_one_line_error(missing, 2, "unknown approval")
    no_by = run(approval_settings, "approval", "approve", approval_id)
    assert no_by.returncode == 2 and "--by" in no_by.stderr

    assert client.wait_for_idle(session_id, timeout=30)["phase"] == "idle"
    assert client.load_user_state(user)["memories"] == []
    decided = run(approval_settings, "approval", "list", "--user", user, "--all")
    assert "kim" in decided.stdout and "approved" in decided.stdout
    help_text = run(approval_settings, "approval", "--help").stdout
    assert all(word in help_text for word in ("list", "approve", "reject"))
