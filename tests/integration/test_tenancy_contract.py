"""Tenancy, on every store (Postgres and SQLite, real Redis and broker, no workers): for
each write that names a session, workflow or approval, another user's call acts exactly
as an unknown id (NotFoundError) and changes no row and no event; the owner's same call
works. Quotas refuse the call past them, naming the setting, with nothing stored; paging
arguments out of range are bad input; an expired approval cannot be approved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Table, select, update

from config import Settings
from state.clock import utcnow
from state.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalExpiredError,
    BadInputError,
    InvalidPayloadError,
    NotFoundError,
    QuotaExceededError,
    SessionOwnershipError,
    WorkflowSessionNotFoundError,
    WorkflowSpecError,
)
from state.storage.db import read_connection
from state.storage.tables import approvals, events, inbox, sessions, steps, workflows
from tasks.client import AgentClient
from tests.support import make_settings, uid

_TABLES: tuple[tuple[Table, str], ...] = (
    (sessions, "session_id"),
    (inbox, "session_id"),
    (events, "session_id"),
    (approvals, "session_id"),
    (workflows, "workflow_id"),
    (steps, "workflow_id"),
    (approvals, "workflow_id"),
)


@pytest.fixture
def tenant_settings(db_url: str) -> Settings:
    return make_settings(
        db_url,
        queue=uid("q"),
        max_queued_messages=3,
        max_pending_approvals=4,
        action_modules="tests.actions_for_tests",
    )


@pytest.fixture
def client(tenant_settings: Settings) -> Iterator[AgentClient]:
    yield AgentClient(tenant_settings)


def rows(client: AgentClient, session_ids: list[str], workflow_ids: list[str]) -> list[Any]:
    """Every row of these sessions and workflows, in every table that holds them."""
    found: list[Any] = []
    with read_connection(client.backend.engine) as conn:
        for table, column in _TABLES:
            ids = session_ids if column == "session_id" else workflow_ids
            query = select(table).where(table.c[column].in_(ids))
            found.append(sorted(tuple(map(str, row)) for row in conn.execute(query)))
    return found


def approval_spec(session_id: str | None = None, steps_asking: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workflow_id": uid("wf"),
        "steps": [
            {"step_id": f"s{i}", "action": "echo", "inputs": {"i": i}, "approval": True}
            for i in range(steps_asking)
        ],
    }
    if session_id is not None:
        spec["session_id"] = session_id
    return spec


def alices_objects(client: AgentClient) -> tuple[str, str, str, str]:
    """A session of alice's (one message waiting), her workflow on it with one step
    waiting for approval, and that approval. Each test's alice is a new user (the
    quotas count per user)."""
    alice, session_id = uid("alice"), uid("s")
    client.send_message(session_id, "hello", user_id=alice)
    workflow_id = client.start_workflow(approval_spec(session_id), user_id=alice)
    (approval,) = [a for a in client.approvals(user_id=alice) if a["workflow_id"] == workflow_id]
    return alice, session_id, workflow_id, str(approval["approval_id"])


def test_another_users_writes_are_unknown_ids_and_change_nothing(client: AgentClient) -> None:
    alice, session_id, workflow_id, approval_id = alices_objects(client)
    # A bob of this test's own: other modules' bobs may own workflows of their own.
    bob = uid("bob")
    before = rows(client, [session_id], [workflow_id])
    attempts: list[Callable[[], object]] = [
        lambda: client.cancel_turn(session_id, user_id=bob),
        lambda: client.cancel_turn(session_id, user_id=bob, rollback=True),
        lambda: client.append_messages(
            session_id, [{"role": "user", "content": "mine"}], user_id=bob
        ),
        lambda: client.cancel_workflow(workflow_id, user_id=bob),
        lambda: client.retry_workflow(workflow_id, user_id=bob),
        lambda: client.decide(approval_id, True, by=bob, user_id=bob),
        lambda: client.decide(approval_id, False, by=bob, user_id=bob),
        lambda: client.fork_session(session_id, 1, uid("fork"), user_id=bob),
        lambda: client.start_workflow(approval_spec(session_id), user_id=bob),
        lambda: client.send_message(session_id, "mine now", user_id=bob),
    ]
    for attempt in attempts:
        with pytest.raises(NotFoundError) as refused:
            attempt()
        # Worded as an unknown id: nothing says whose it is.
        assert bob not in str(refused.value) and "another user" not in str(refused.value)
    assert rows(client, [session_id], [workflow_id]) == before
    # Reads: as unknown ids too.
    assert client.get_session(session_id, user_id=bob) is None
    assert client.get_workflow(workflow_id, user_id=bob) is None
    assert client.approvals(user_id=bob) == []
    assert client.list_workflows(user_id=bob, limit=1000)["items"] == []
    # The owner's same calls work.
    assert client.decide(approval_id, False, by=alice, user_id=alice)["decision"] == "rejected"
    assert client.get_workflow(workflow_id, user_id=alice)["status"] == "failed"  # type: ignore[index]
    assert client.retry_workflow(workflow_id, user_id=alice)["status"] == "running"
    assert client.cancel_workflow(workflow_id, user_id=alice)["status"] == "cancelled"
    assert client.cancel_turn(session_id, user_id=alice) is False  # nothing ran (no workers)
    listed = client.list_workflows(user_id=alice, limit=1000)["items"]
    assert workflow_id in {item["workflow_id"] for item in listed}


def test_a_spec_naming_an_unknown_or_another_users_session_is_refused(
    client: AgentClient,
) -> None:
    _, session_id, _, _ = alices_objects(client)
    for spec, user in ((approval_spec(uid("nowhere")), None), (approval_spec(session_id), "bob")):
        before = client.approvals(pending=False)
        with pytest.raises(WorkflowSessionNotFoundError) as refused:
            client.start_workflow(spec, user_id=user)
        assert isinstance(refused.value, NotFoundError | WorkflowSpecError)
        assert client.get_workflow(spec["workflow_id"]) is None
        assert client.approvals(pending=False) == before
    # SessionOwnershipError (a message to another user's session) is a NotFoundError too.
    with pytest.raises(SessionOwnershipError):
        client.send_message(session_id, "hi", user_id="bob")


def test_a_workflow_of_no_session_belongs_to_who_started_it(client: AgentClient) -> None:
    workflow_id = client.start_workflow(approval_spec(), user_id="carol")
    assert client.get_workflow(workflow_id, user_id="carol") is not None
    assert client.get_workflow(workflow_id, user_id="dave") is None
    with pytest.raises(NotFoundError):
        client.cancel_workflow(workflow_id, user_id="dave")
    # The same id and spec, started again by another user, is not theirs to learn of.
    spec = {**approval_spec(), "workflow_id": workflow_id}
    with pytest.raises(BadInputError):
        client.start_workflow(spec, user_id="dave")


def test_pending_approvals_quota_refuses_past_it_and_stores_nothing(
    client: AgentClient,
) -> None:
    user = uid("u")
    first = client.start_workflow(approval_spec(steps_asking=3), user_id=user)
    client.start_workflow(approval_spec(steps_asking=1), user_id=user)
    spec = approval_spec(steps_asking=1)
    with pytest.raises(QuotaExceededError, match="AGENTSTATE_MAX_PENDING_APPROVALS"):
        client.start_workflow(spec, user_id=user)
    assert client.get_workflow(spec["workflow_id"]) is None
    assert len(client.approvals(user_id=user)) == 4
    # Cancelling frees its places (its requests are closed); a retry that would ask
    # again past the quota is refused and leaves the workflow as it was.
    client.cancel_workflow(first, user_id=user)
    client.start_workflow(spec, user_id=user)
    assert len(client.approvals(user_id=user)) == 2
    before = rows(client, [], [first])
    with pytest.raises(QuotaExceededError, match="AGENTSTATE_MAX_PENDING_APPROVALS"):
        client.retry_workflow(first, user_id=user)
    assert rows(client, [], [first]) == before
    assert client.get_workflow(first)["status"] == "cancelled"  # type: ignore[index]


def test_queued_messages_quota_refuses_past_it_and_stores_nothing(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    ids = [client.send_message(session_id, f"m{i}", user_id=user) for i in range(3)]
    assert len(set(ids)) == 3
    before = rows(client, [session_id], [])
    with pytest.raises(QuotaExceededError, match="AGENTSTATE_MAX_QUEUED_MESSAGES"):
        client.send_message(session_id, "one too many", user_id=user)
    assert rows(client, [session_id], []) == before
    # A repeat under an idempotency key already accepted is no new message: it answers.
    other = uid("s")
    key_id = client.send_message(other, "x", user_id=user, idempotency_key="k")
    for i in range(2):
        client.send_message(other, f"m{i}", user_id=user)
    assert client.send_message(other, "x", user_id=user, idempotency_key="k") == key_id


def expire(client: AgentClient, approval_id: str) -> None:
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(approvals)
            .where(approvals.c.approval_id == approval_id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )


def test_an_expired_approval_cannot_be_approved_and_is_recorded_expired(
    client: AgentClient,
) -> None:
    alice, _, workflow_id, approval_id = alices_objects(client)
    expire(client, approval_id)  # and beat is not running
    with pytest.raises(ApprovalExpiredError):
        client.decide(approval_id, True, by=alice, user_id=alice)
    decided = client._desk.get(approval_id)
    assert decided is not None and (decided["decision"], decided["by"]) == ("rejected", "expired")
    assert client.get_workflow(workflow_id)["status"] == "failed"  # type: ignore[index]
    # Again: still expired (a subclass of already decided), nothing more recorded.
    with pytest.raises(ApprovalAlreadyDecidedError):
        client.decide(approval_id, True, by=alice)
    assert client._desk.get(approval_id) == decided


FULLWIDTH_EXPIRED = "\uff25\uff38\uff30\uff29\uff32\uff25\uff24"


@pytest.mark.parametrize(
    "by", ["expired", "cancelled", "Cancelled", " skipped ", "turn ended", FULLWIDTH_EXPIRED]
)
def test_the_systems_by_markers_are_reserved(client: AgentClient, by: str) -> None:
    _, _, workflow_id, approval_id = alices_objects(client)
    before = rows(client, [], [workflow_id])
    with pytest.raises(InvalidPayloadError, match="reserved"):
        client.decide(approval_id, True, by=by)
    assert rows(client, [], [workflow_id]) == before


@pytest.mark.parametrize("value", [-1, 10**30, 2**63, True, "10"])
def test_paging_arguments_out_of_range_are_bad_input(client: AgentClient, value: Any) -> None:
    _, session_id, _, _ = alices_objects(client)
    calls: list[Callable[[], object]] = [
        lambda: client.get_session(session_id, history_limit=value),
        lambda: client.get_session(session_id, before_seq=value),
        lambda: client.get_session(session_id, revision=value),
        lambda: list(client.events(session_id, after=value)),
        lambda: client.list_workflows(limit=value),
        lambda: client.list_sessions(limit=value),
    ]
    for call in calls:
        with pytest.raises(InvalidPayloadError):
            call()


def test_racing_starts_cannot_pass_the_approvals_quota_together(pg_url: str) -> None:
    # Postgres: each start counts under the user's advisory lock, so 8 racers asking for
    # one approval each against a quota of 4 leave exactly 4 workflows.
    client = AgentClient(make_settings(pg_url, queue=uid("q"), max_pending_approvals=4))
    user, start = uid("u"), threading.Barrier(8)
    started: list[str] = []
    refused: list[str] = []

    def race() -> None:
        start.wait()
        try:
            started.append(client.start_workflow(approval_spec(), user_id=user))
        except QuotaExceededError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(started) == 4 and len(refused) == 4
    assert len(client.approvals(user_id=user)) == 4
    assert {w["workflow_id"] for w in client.list_workflows(user_id=user)["items"]} == set(started)


def test_racing_sends_cannot_pass_the_inbox_quota_together(pg_url: str) -> None:
    # Postgres: the accept's own statement counts, and the row lock orders the racers.
    client = AgentClient(make_settings(pg_url, queue=uid("q"), max_queued_messages=3))
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "first", user_id=user)
    start = threading.Barrier(8)
    accepted: list[str] = []
    refused: list[str] = []

    def race(i: int) -> None:
        start.wait()
        try:
            accepted.append(client.send_message(session_id, f"m{i}", user_id=user))
        except QuotaExceededError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(accepted) == 2 and len(refused) == 6
    assert client.get_session(session_id, history_limit=0)["queued"] == 3  # type: ignore[index]
