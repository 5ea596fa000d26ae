"""Webhooks in-process on each backend: the outbox rows written in the transaction of the
change (a turn's commits, approvals, workflows), who hears what, and the sender against a
real local receiver that verifies signatures with the Standard Webhooks library."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import delete, select, update

from config import Settings
from state.errors import BadInputError, NotFoundError, RunStateError, WebhookSpecError
from state.storage.db import read_connection
from state.storage.tables import approvals, workflows
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks.courier import Courier
from state.workflows.store import WorkflowStore
from tasks.client import AgentClient
from tests.integration.test_turn_engine import drain, engine_for
from tests.support import make_settings, uid
from tests.webhook_receiver import Receiver

ALL = [
    "turn.completed",
    "turn.failed",
    "approval.requested",
    "approval.decided",
    "workflow.completed",
    "workflow.failed",
    "schedule.fired",
]


@pytest.fixture
def client(settings: Settings) -> Iterator[AgentClient]:
    made = AgentClient(
        make_settings(
            settings.database_url,
            webhook_allow_private=True,
            webhook_retry_base_seconds=0.01,
            webhook_timeout=2.0,
            action_modules="tests.actions_for_tests",
        )
    )
    # Hooks are global (an operator's hears everything): each test starts with none and
    # leaves none, or later modules' turns would keep writing deliveries for them.
    with made.backend.engine.begin() as conn:
        conn.execute(delete(webhooks))
        conn.execute(delete(deliveries))
    yield made
    with made.backend.engine.begin() as conn:
        conn.execute(delete(webhooks))
        conn.execute(delete(deliveries))


def rows(client: AgentClient, webhook_id: str) -> list[dict[str, Any]]:
    with read_connection(client.backend.engine) as conn:
        found = conn.execute(
            select(deliveries.c.event, deliveries.c.payload).where(
                deliveries.c.webhook_id == webhook_id
            )
        ).all()
    from state.documents import codec

    return [{"event": e, **(codec.loads(p) if isinstance(p, str) else p)} for e, p in sorted(found)]


def a_turn(settings: Settings, session_id: str, user_id: str, text: str) -> None:
    engine, dispatcher = engine_for(settings)
    item = engine.services.inbox.accept(session_id, user_id, text)
    dispatcher.phase("understanding", session_id, item.session_revision)
    drain(engine, dispatcher)


def test_a_turn_tells_its_users_hooks_and_the_operators(client: AgentClient) -> None:
    alice, bob, session = uid("alice"), uid("bob"), uid("s")
    mine = client.add_webhook("http://127.0.0.1:9/a", ["turn.completed"], user_id=alice)
    theirs = client.add_webhook("http://127.0.0.1:9/b", ALL, user_id=bob)
    operator = client.add_webhook("http://127.0.0.1:9/o", ALL)
    narrow = client.add_webhook("http://127.0.0.1:9/n", ALL, user_id=alice, session_id=uid("s"))
    a_turn(client.settings, session, alice, "what is 6*7?")
    told = rows(client, mine["webhook_id"])
    assert [t["event"] for t in told] == ["turn.completed"]
    (body,) = told
    assert body["type"] == "turn.completed" and body["timestamp"].endswith("Z")
    assert body["data"]["session_id"] == session and body["data"]["user_id"] == alice
    assert body["data"]["message_id"]
    assert [t["event"] for t in rows(client, operator["webhook_id"])] == ["turn.completed"]
    assert rows(client, theirs["webhook_id"]) == []
    assert rows(client, narrow["webhook_id"]) == []


def test_approvals_and_workflows_are_told_in_their_own_commits(client: AgentClient) -> None:
    alice = uid("alice")
    hook = client.add_webhook("http://127.0.0.1:9/a", ALL, user_id=alice)
    spec = {
        "workflow_id": uid("wf"),
        "steps": [{"step_id": "a", "action": "echo", "inputs": {}, "approval": True}],
    }
    wf = client.workflows.validate(spec, ["echo"])
    WorkflowStore.for_engine(client.backend.engine).create(wf, 60.0, user_id=alice)
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(approvals)
            .where(approvals.c.workflow_id == wf.workflow_id)
            .values(decision="approved", decided_by="carol")
        )
        conn.execute(
            update(workflows)
            .where(workflows.c.workflow_id == wf.workflow_id)
            .values(status="failed")
        )
    told = {t["event"]: t["data"] for t in rows(client, hook["webhook_id"])}
    assert set(told) == {"approval.requested", "approval.decided", "workflow.failed"}
    assert told["approval.decided"]["approve"] is True and told["approval.decided"]["by"] == "carol"
    assert told["approval.requested"]["workflow_id"] == wf.workflow_id
    assert told["workflow.failed"] == {
        "workflow_id": wf.workflow_id,
        "session_id": None,
        "user_id": alice,
        "status": "failed",
    }


def test_three_attempts_one_webhook_id_signatures_verified(client: AgentClient) -> None:
    receiver = Receiver(script=[500, 500]).start()
    try:
        hook = client.add_webhook(receiver.url, ["turn.completed"], user_id=(user := uid("u")))
        receiver.secret = hook["secret"]
        a_turn(client.settings, uid("s"), user, "hello there")
        courier = Courier.build(client.backend.engine, client.settings)
        outcomes = send_until_settled(courier)
        assert outcomes == ["retrying", "retrying", "delivered"]
        assert [r.answered for r in receiver] == [500, 500, 200]
        assert len(set(receiver.ids())) == 1
        assert all(isinstance(r.verified, dict) for r in receiver), [r.verified for r in receiver]
        (listed,) = client.webhook_deliveries(hook["webhook_id"])
        assert listed["delivery_id"] == receiver.ids()[0]
        assert listed["status"] == "delivered"
        assert [a["status_code"] for a in listed["attempts"]] == [500, 500, 200]
        # Redelivered: a fresh attempt, the same webhook-id.
        client.redeliver(listed["delivery_id"], user_id=user)
        assert send_until_settled(courier) == ["delivered"]
        assert receiver.ids() == [listed["delivery_id"]] * 4
    finally:
        receiver.stop()


def send_until_settled(courier: Courier, rounds: int = 200) -> list[str]:
    """Claim and send what is due until nothing is pending (the backoff is tiny)."""
    outcomes: list[str] = []
    for _ in range(rounds):
        due = courier.due()
        for delivery_id, claim in due:
            outcomes.append(courier.deliver(delivery_id, claim))
        if outcomes and outcomes[-1] in ("delivered", "failed") and not due:
            return outcomes
        time.sleep(0.01)
    return outcomes


def test_gone_disables_the_hook_and_what_it_had_pending(client: AgentClient) -> None:
    receiver = Receiver(script=[410]).start()
    try:
        user = uid("u")
        hook = client.add_webhook(receiver.url, ["turn.completed"], user_id=user)
        a_turn(client.settings, uid("s"), user, "one")
        a_turn(client.settings, uid("s"), user, "two")
        courier = Courier.build(client.backend.engine, client.settings)
        first = courier.due(limit=1)
        assert [courier.deliver(*d) for d in first] == ["failed"]
        assert courier.due() == []
        (listed,) = client.list_webhooks(user_id=user)
        assert listed["enabled"] is False and "410" in listed["disabled_reason"]
        statuses = [d["status"] for d in client.webhook_deliveries(hook["webhook_id"])]
        assert statuses == ["failed", "failed"]
        with pytest.raises(RunStateError):
            client.redeliver(first[0][0])
    finally:
        receiver.stop()


def test_attempts_stop_at_the_maximum(client: AgentClient) -> None:
    receiver = Receiver(then=503).start()
    try:
        user = uid("u")
        hook = client.add_webhook(receiver.url, ["turn.completed"], user_id=user)
        a_turn(client.settings, uid("s"), user, "hi")
        courier = Courier.build(client.backend.engine, client.settings)
        courier = replace(courier, retry=replace(courier.retry, max_attempts=3))
        assert send_until_settled(courier) == ["retrying", "retrying", "failed"]
        (listed,) = client.webhook_deliveries(hook["webhook_id"])
        assert len(listed["attempts"]) == 3 and listed["status"] == "failed"
    finally:
        receiver.stop()


def test_a_claim_taken_over_records_nothing(client: AgentClient) -> None:
    user = uid("u")
    client.add_webhook("http://127.0.0.1:9/x", ["turn.completed"], user_id=user)
    a_turn(client.settings, uid("s"), user, "hi")
    courier = Courier.build(client.backend.engine, client.settings)
    # A sender killed mid-send: its lease runs out and the next look claims it again.
    quick = replace(courier, send=replace(courier.send, timeout_s=0.01))
    ((delivery_id, first),) = quick.store.claim_due(lease_s=0.0)
    ((again, second),) = quick.store.claim_due(lease_s=60.0)
    assert again == delivery_id and second != first
    assert quick.deliver(delivery_id, first) == "stale"
    assert quick.deliver(delivery_id, second) == "retrying"  # nothing listens on port 9


def test_private_urls_are_refused_without_the_setting(settings: Settings) -> None:
    strict = AgentClient(make_settings(settings.database_url))
    for url in (
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://10.1.2.3/x",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
    ):
        with pytest.raises(WebhookSpecError, match="AGENTSTATE_WEBHOOK_ALLOW_PRIVATE"):
            strict.add_webhook(url, ["turn.completed"], user_id="u-private")
    for url, says in (
        ("ftp://example.com/x", "http"),
        ("http://user:pw@example.com/x", "password"),
        ("http://example.com/x", "events"),
    ):
        with pytest.raises(WebhookSpecError, match=says):
            strict.add_webhook(url, [] if says == "events" else ["turn.completed"])
    with pytest.raises(WebhookSpecError, match="unknown event"):
        strict.add_webhook("http://127.0.0.1/x", ["turn.done"])
    assert strict.list_webhooks(user_id="u-private") == []


def test_a_url_checked_again_at_send_time(client: AgentClient) -> None:
    """Registered while private addresses were allowed; a sender without the setting
    refuses to connect (as it would after a DNS answer changed to a private address)."""
    user = uid("u")
    client.add_webhook("http://127.0.0.1:9/x", ["turn.completed"], user_id=user)
    a_turn(client.settings, uid("s"), user, "hi")
    courier = Courier.build(client.backend.engine, client.settings)
    strict = replace(courier, send=replace(courier.send, allow_private=False))
    assert [strict.deliver(*d) for d in strict.due()] == ["retrying"]
    (hook,) = client.list_webhooks(user_id=user)
    (listed,) = client.webhook_deliveries(hook["webhook_id"])
    assert "AGENTSTATE_WEBHOOK_ALLOW_PRIVATE" in listed["attempts"][0]["error"]


def test_another_users_hook_reads_as_unknown(client: AgentClient) -> None:
    alice, bob = uid("alice"), uid("bob")
    hook = client.add_webhook("http://127.0.0.1:9/a", ALL, user_id=alice)
    assert client.list_webhooks(user_id=bob) == []
    with pytest.raises(NotFoundError):
        client.webhook_deliveries(hook["webhook_id"], user_id=bob)
    with pytest.raises(NotFoundError):
        client.remove_webhook(hook["webhook_id"], user_id=bob)
    assert client.remove_webhook(hook["webhook_id"], user_id=alice) is True
    with pytest.raises(BadInputError):
        client.add_webhook("http://127.0.0.1:9/a", ALL, secret="not-a-secret")
