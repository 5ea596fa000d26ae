"""An open event stream of a session that is erased while it is open, whose id someone
else then takes (issue 39): the stream ends with ``event: end`` ``{"reason": "gone"}``
and carries nothing of the new owner, neither events nor token chunks. Against a real
``agentstate serve`` with real workers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from config import Settings
from tests.api_support import Api, new_keys, replied, serving, wait_for
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers
ALICE, BOB = uid("alice"), uid("bob")


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp("reuse")
    pool = Workers(settings, folder, count=1).start()
    try:
        with serving(settings, folder, new_keys(ALICE, BOB, "*")) as running:
            yield running
    finally:
        pool.stop()


def messages(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, data) of each SSE message, as an EventSource reads them."""
    kind, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield kind, json.loads("\n".join(data))
            kind, data = "message", []


def test_a_stream_of_an_erased_session_ends_and_never_follows_the_next_owner(api: Api) -> None:
    alice, bob, operator = api.client(ALICE), api.client(BOB), api.client("*")
    session_id = uid("team-chat")
    sent = alice.post(
        f"/v1/sessions/{session_id}/messages", json={"text": "hello from alice", "user_id": ALICE}
    )
    assert sent.status_code == 202, sent.text
    wait_for(lambda: replied(alice, session_id), what="alice's reply")
    seen: list[tuple[str, dict[str, Any]]] = []
    opened = threading.Event()

    def follow() -> None:
        with alice.stream(
            "GET", f"/v1/sessions/{session_id}/events", params={"tokens": "true"}
        ) as response:
            assert response.status_code == 200
            for message in messages(response):
                seen.append(message)
                opened.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert opened.wait(30)
    assert operator.delete(f"/v1/users/{ALICE}").status_code == 200
    sent = bob.post(
        f"/v1/sessions/{session_id}/messages",
        json={"text": "trickle: bob's private words", "user_id": BOB},
    )
    assert sent.status_code == 202, sent.text
    wait_for(lambda: replied(bob, session_id), what="bob's reply")
    follower.join(30)

    assert not follower.is_alive(), "Alice's stream is still open"
    assert seen[-1] == ("end", {"reason": "gone"}), seen[-3:]
    texts = [json.dumps(data) for _, data in seen]
    assert any("hello from alice" in text for text in texts)
    assert not any("bob" in text or "part " in text for text in texts), texts
