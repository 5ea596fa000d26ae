"""Ids that come back (issue 39): erasure and retention free an id and anyone may take it
again. Nothing a worker or a follower kept of the old row (its generation) reaches the new
one, nor the reverse. Real workers, Postgres and Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def client(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentClient]:
    # One worker of one child: every step of both owners runs in the one process whose
    # memo of workflow contexts the old owner filled.
    pool = Workers(settings, tmp_path_factory.mktemp("generations"), count=1).start()
    yield AgentClient(settings)
    pool.stop()


def nightly(workflow_id: str, secret: str) -> dict[str, Any]:
    """Six steps reading the context: three claimed, three quick (run from what their
    message carries), in one chain."""
    actions = ["context_secret"] * 3 + ["quick_context_secret"] * 3
    steps = [
        {"step_id": f"s{n}", "action": name, "inputs": {}, "dependencies": [f"s{n - 1}"][:n]}
        for n, name in enumerate(actions)
    ]
    return {"workflow_id": workflow_id, "context": {"tenant_secret": secret}, "steps": steps}


def seen(client: AgentClient, workflow_id: str, user_id: str) -> list[Any]:
    doc = client.wait_for_workflow(workflow_id, timeout=60)
    assert doc["status"] == "success", doc
    found = client.get_workflow(workflow_id, user_id=user_id)
    assert found is not None
    return [step["outputs"]["seen"] for step in found["steps"].values()]


def test_a_workflow_context_never_reaches_the_next_owner_of_its_id(client: AgentClient) -> None:
    alice, bob, workflow_id = uid("alice"), uid("bob"), uid("wf-nightly")
    client.start_workflow(nightly(workflow_id, "ALICE-SECRET-TOKEN"), user_id=alice)
    assert seen(client, workflow_id, alice) == ["ALICE-SECRET-TOKEN"] * 6

    client.erase_user(alice)
    client.start_workflow(nightly(workflow_id, "BOB-OWN-CONTEXT"), user_id=bob)

    assert seen(client, workflow_id, bob) == ["BOB-OWN-CONTEXT"] * 6


def test_a_follower_of_an_erased_session_ends_and_never_reads_the_next_owner(
    client: AgentClient,
) -> None:
    alice, bob, session_id = uid("alice"), uid("bob"), uid("team-chat")
    client.send_message(session_id, "hello from alice", user_id=alice)
    client.wait_for_idle(session_id, timeout=60)
    followed: list[dict[str, Any]] = []
    opened = threading.Event()

    def follow() -> None:
        for event in client.events(session_id, follow=True, timeout=60, user_id=alice, tokens=True):
            followed.append(event)
            opened.set()

    follower = threading.Thread(target=follow)
    follower.start()
    assert opened.wait(30)
    client.erase_user(alice)
    client.send_message(session_id, "trickle: bob's private words", user_id=bob)
    client.wait_for_idle(session_id, timeout=60)
    follower.join(30)

    assert not follower.is_alive(), "the follower of Alice's session kept following"
    texts = [str(event.get("data")) for event in followed]
    assert any("hello from alice" in text for text in texts)
    assert not any("bob" in text or "part " in text for text in texts), texts


def test_a_turn_of_an_erased_session_still_streaming_never_reaches_the_next_owner(
    client: AgentClient,
) -> None:
    alice, bob, session_id = uid("alice"), uid("bob"), uid("team-chat")
    # Twelve chunks with a pause halfway: Alice's handler goes on streaming after erasure.
    client.send_message(session_id, "trickle stall: alice's words", user_id=alice)
    for event in client.events(session_id, follow=True, timeout=30, user_id=alice, tokens=True):
        if event["kind"] == "token":
            break  # Alice's turn is streaming now
    client.erase_user(alice)
    mine = {client.send_message(session_id, "hello, it is bob", user_id=bob)}
    followed = list(client.events(session_id, follow=True, timeout=6, user_id=bob, tokens=True))

    chunks = [event for event in followed if event["kind"] == "token"]
    assert all(chunk["data"]["message_id"] in mine for chunk in chunks), chunks
    assert not any("alice" in str(event["data"]) for event in followed), followed
