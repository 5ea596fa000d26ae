"""Many users on one deployment, through real workers (and no beat: expiry must hold
without it): another user's decide, cancel, retry or start acts as an unknown id and
changes nothing; 16 racing deciders, owners and others, make one decision; listings
never show another user's objects; an expired request cannot be approved, and a decision
racing expiry records exactly one outcome; the quotas refuse past them, storing nothing.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import update

from config import Settings
from state.clock import utcnow
from state.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalExpiredError,
    NotFoundError,
    QuotaExceededError,
)
from state.storage.tables import approvals
from tasks.client import AgentClient
from tests.agents import LINGER_S, risky_key
from tests.e2e.test_approvals import ask, event_kinds, remember_two, replies, wait_until
from tests.services import PrivateRedis
from tests.support import REPO, Workers, agent_test_settings, settings_env, uid

pytestmark = pytest.mark.workers

RACERS = 16
MAX_QUEUED = 3


@pytest.fixture(scope="module")
def tenancy_settings(pg_url: str, private_redis: PrivateRedis) -> Settings:
    return agent_test_settings(
        pg_url, redis_url=f"{private_redis.url}/0", max_queued_messages=MAX_QUEUED
    )


@pytest.fixture(scope="module")
def client(
    tenancy_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    log_dir: Path = tmp_path_factory.mktemp("tenancy")
    pool = Workers(tenancy_settings, log_dir, count=2).start()
    yield AgentClient(tenancy_settings)
    pool.stop()


@pytest.fixture
def effects(tenancy_settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(tenancy_settings.redis_url, decode_responses=True)


def test_another_user_cannot_decide_or_cancel_alices_turn(client: AgentClient) -> None:
    alice, mallory = uid("alice"), uid("mallory")
    remember_two(client, alice)
    session_id, approval = ask(client, "forget everything", alice)
    approval_id = str(approval["approval_id"])
    kinds = event_kinds(client, session_id)
    for attempt in (
        lambda: client.decide(approval_id, True, by="mallory", user_id=mallory),
        lambda: client.cancel_turn(session_id, user_id=mallory),
    ):
        with pytest.raises(NotFoundError):
            attempt()
    assert event_kinds(client, session_id) == kinds
    assert client.get_session(session_id)["phase"] == "awaiting_approval"  # type: ignore[index]
    assert len(client.load_user_state(alice)["memories"]) == 2  # nothing forgotten
    client.decide(approval_id, False, by="alice", user_id=alice)
    assert client.wait_for_idle(session_id, timeout=30)["phase"] == "idle"
    assert len(client.load_user_state(alice)["memories"]) == 2


def test_sixteen_racing_deciders_owners_and_others_one_wins(
    client: AgentClient, effects: redis.Redis
) -> None:
    alice = uid("alice")
    session_id, approval = ask(client, "risky business", alice)
    start = threading.Barrier(RACERS)
    won: list[dict[str, Any]] = []
    late: list[str] = []
    unknown: list[str] = []

    def decide(i: int) -> None:
        user = alice if i % 2 == 0 else uid("other")
        start.wait()
        try:
            won.append(client.decide(approval["approval_id"], i % 4 == 0, by=f"p{i}", user_id=user))
        except ApprovalAlreadyDecidedError as exc:
            late.append(str(exc))
        except NotFoundError as exc:
            unknown.append(str(exc))

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(late) == RACERS // 2 - 1 and len(unknown) == RACERS // 2
    assert won[0]["by"] in {f"p{i}" for i in range(0, RACERS, 2)}  # an owner won
    doc = client.wait_for_idle(session_id, timeout=30)
    assert len(replies(doc)) == 1
    assert int(effects.get(risky_key(session_id)) or 0) == (1 if won[0]["approved"] else 0)
    assert event_kinds(client, session_id).count("approval_decided") == 1


def test_an_expired_turn_approval_cannot_be_approved_without_beat(
    client: AgentClient, effects: redis.Redis
) -> None:
    alice = uid("alice")
    session_id, approval = ask(client, "risky but hasty", alice)  # expires after 1 s
    time.sleep(1.2)
    with pytest.raises(ApprovalExpiredError):
        client.decide(approval["approval_id"], True, by="alice", user_id=alice)
    (kept,) = client.approvals(user_id=alice, pending=False)
    assert (kept["decision"], kept["by"]) == ("rejected", "expired")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle" and len(replies(doc)) == 1
    assert effects.get(risky_key(session_id)) is None  # the action never ran
    assert event_kinds(client, session_id).count("approval_decided") == 1


def test_a_decision_racing_expiry_records_one_outcome(client: AgentClient) -> None:
    for _round in range(4):
        race_expiry(client)


def race_expiry(client: AgentClient) -> None:
    """A step's approval expiring in 0.2 s; its owner approves, and beat's expiry runs,
    both at about that moment: exactly one outcome is recorded, and it is the one that
    happens (the step runs only if the approval stood)."""
    alice = uid("alice")
    spec = {"steps": [{"step_id": "pay", "action": "echo", "approval": True}]}
    workflow_id = client.start_workflow(spec, user_id=alice)
    (approval,) = client.approvals(user_id=alice)
    approval_id = str(approval["approval_id"])
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(approvals)
            .where(approvals.c.approval_id == approval_id)
            .values(expires_at=utcnow() + timedelta(seconds=0.2))
        )
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def approve() -> None:
        start.wait()
        time.sleep(0.2)
        try:
            client.decide(approval_id, True, by="alice", user_id=alice)
            outcomes.append("approved")
        except ApprovalAlreadyDecidedError as exc:
            outcomes.append(type(exc).__name__)

    def expire() -> None:
        start.wait()
        time.sleep(0.2)
        outcomes.append(f"expired {client._desk.expire_due()}")

    threads = [threading.Thread(target=approve), threading.Thread(target=expire)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (stored,) = client.approvals(user_id=alice, pending=False)
    step = client.wait_for_workflow(workflow_id, timeout=30)["steps"]["pay"]
    if stored["decision"] == "approved":
        assert "approved" in outcomes
        assert step["status"] == "success"
    else:
        assert stored["by"] == "expired" and "approved" not in outcomes
        assert step["status"] == "failed"


def test_listings_never_show_another_users_objects(client: AgentClient) -> None:
    alice, bob = uid("alice"), uid("bob")
    ask(client, "risky listing", alice)
    alices_flow = client.start_workflow({"steps": [{"step_id": "a", "action": "echo"}]}, alice)
    ask(client, "risky too", bob)
    bobs_flow = client.start_workflow({"steps": [{"step_id": "a", "action": "echo"}]}, bob)
    for user, theirs, other in ((alice, alices_flow, bobs_flow), (bob, bobs_flow, alices_flow)):
        sessions = client.list_sessions(user_id=user, limit=1000)["items"]
        assert sessions and {s["user_id"] for s in sessions} == {user}
        flows = {w["workflow_id"] for w in client.list_workflows(user_id=user, limit=1000)["items"]}
        assert theirs in flows and other not in flows
        for pending in (True, False):
            listed = client.approvals(user_id=user, pending=pending)
            assert listed and {a["user_id"] for a in listed} == {user}
        assert client.get_workflow(other, user_id=user) is None


def test_an_inbox_takes_max_queued_messages_then_refuses(client: AgentClient) -> None:
    alice, session_id = uid("alice"), uid("s")
    client.send_message(session_id, "linger a while", user_id=alice)  # holds the turn
    # Only once its turn runs has it left the queue; until then it counts as waiting.
    wait_until(lambda: client.get_session(session_id, user_id=alice)["phase"] == "executing")  # type: ignore[index]
    for i in range(MAX_QUEUED):
        client.send_message(session_id, f"what is {i}+1?", user_id=alice)
    with pytest.raises(QuotaExceededError, match="AGENTSTATE_MAX_QUEUED_MESSAGES"):
        client.send_message(session_id, "one too many", user_id=alice)
    doc = client.wait_for_idle(session_id, timeout=30 + 4 * LINGER_S)
    users = [m["content"] for m in doc["message_history"] if m["role"] == "user"]
    assert "one too many" not in users and len(users) == MAX_QUEUED + 1
    assert len(replies(doc)) == MAX_QUEUED + 1
    # Once its turns ran, the inbox takes messages again.
    client.send_message(session_id, "and now?", user_id=alice)


def test_the_multi_user_example_runs(client: AgentClient, tenancy_settings: Settings) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "multi_user.py")],
        cwd=REPO,
        env=settings_env(tenancy_settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("mallory: unknown") == 3
    assert "alice:" in result.stdout


def test_the_cli_acts_as_the_user_given_with_user(
    client: AgentClient, tenancy_settings: Settings
) -> None:
    from tests.e2e.test_cli import assert_one_line_error, run

    alice, mallory = uid("alice"), uid("mallory")
    session_id, approval = ask(client, "risky on the command line", alice)
    approval_id = str(approval["approval_id"])
    # A durable timer keeps it running without holding a worker (a sleeping step would).
    spec = {"steps": [{"step_id": "a", "action": "echo", "not_before_s": 3600}]}
    workflow_id = client.start_workflow(spec, user_id=alice)
    for args, words in (
        (("approval", "approve", approval_id, "--by", "m"), "unknown approval"),
        (("session", "cancel", session_id), "unknown session"),
        (("session", "show", session_id), "unknown session"),
        (("session", "events", session_id), "unknown session"),
        (("workflow", "show", workflow_id), "unknown workflow"),
        (("workflow", "cancel", workflow_id), "unknown workflow"),
        (("workflow", "retry", workflow_id), "unknown workflow"),
    ):
        assert_one_line_error(run(tenancy_settings, *args, "--user", mallory), 2, words)
    refused = run(tenancy_settings, "approval", "approve", approval_id, "--by", "expired")
    assert_one_line_error(refused, 2, "reserved")
    assert client.approvals(user_id=alice)[0]["decision"] is None
    assert client.get_workflow(workflow_id)["status"] == "running"  # type: ignore[index]
    listed = run(tenancy_settings, "workflow", "list", "--user", mallory, "--json")
    assert workflow_id not in listed.stdout
    cancelled = run(tenancy_settings, "workflow", "cancel", workflow_id, "--user", alice)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    decided = run(tenancy_settings, "approval", "reject", approval_id, "--by", "a", "--user", alice)
    assert decided.returncode == 0, decided.stderr
