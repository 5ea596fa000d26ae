"""Flower, started by the test, sees the workers and every agentstate.* task of a turn."""

from __future__ import annotations

import base64
import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tasks.worker.processes import Flower, free_port
from tests.support import REPO, Workers, settings_env, uid

pytestmark = pytest.mark.workers
AUTH = "tester:s3cret"


def _fetch(url: str, auth: str | None = AUTH) -> bytes:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return bytes(response.read())


def _get(url: str, auth: str | None = AUTH) -> Any:
    return json.loads(_fetch(url, auth) or b"null")


@pytest.fixture(scope="module")
def flower(worker_settings: Settings, workers: Workers) -> Iterator[str]:
    env = settings_env(worker_settings)
    server = Flower(worker_settings, free_port(), cwd=REPO, env=env, basic_auth=AUTH)
    if not server.wait_ready():
        server.stop()
        pytest.fail("Flower did not come up")
    time.sleep(1.0)  # let Flower subscribe to events before the turn starts
    yield server.url
    server.stop()


def test_flower_sees_the_workers_and_every_phase_task_of_a_turn(
    flower: str, worker_settings: Settings, workers: Workers
) -> None:
    client = AgentClient(worker_settings)
    session_id = uid("flower")
    client.send_message(session_id, "what is 7*6?", user_id=uid("u"))
    client.wait_for_idle(session_id, timeout=30)
    expected = {
        f"agentstate.phase.{p}"
        for p in (
            "understanding",
            "planning",
            "retrieving",
            "executing",
            "evaluating",
            "generating",
        )
    }
    seen: set[str] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not expected <= seen:
        tasks = _get(f"{flower}/api/tasks?limit=2000")
        seen = {t["name"] for t in tasks.values() if session_id in str(t.get("args"))}
        time.sleep(0.3)
    assert expected <= seen, f"Flower saw {sorted(seen)}"
    _assert_one_chain(tasks, session_id)
    names = set(_get(f"{flower}/api/workers?refresh=1"))
    assert set(workers.alive()) <= names


def _assert_one_chain(tasks: dict[str, Any], session_id: str) -> None:
    """Each phase task was sent by the one before it (its parent), all under the turn's
    first task (their root): how Flower links a turn's tasks, whichever path sent them."""
    turn = [t for t in tasks.values() if session_id in str(t.get("args"))]
    by_id = {t["uuid"]: t for t in turn}
    order = ["understanding", "planning", "retrieving", "executing", "evaluating", "generating"]
    by_name = {t["name"].rsplit(".", 1)[1]: t for t in turn if t.get("parent_id") in by_id}
    assert sorted(by_name) == sorted(order[1:]), f"sent by a phase: {sorted(by_name)}"
    for before, phase in itertools.pairwise(order[1:]):
        assert by_name[phase]["parent_id"] == by_name[before]["uuid"]
    first = by_id[by_name["planning"]["parent_id"]]
    assert first["name"] == "agentstate.phase.understanding"
    assert {t["root_id"] for t in by_name.values()} == {first["root_id"] or first["uuid"]}


def test_flower_api_requires_the_basic_auth_credentials(flower: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(f"{flower}/api/workers", auth=None)
    assert refused.value.code == 401


def test_flower_shows_the_broker_and_the_queue_lengths(
    flower: str, worker_settings: Settings
) -> None:
    # Flower picks its broker client by the URL's scheme; our transport must not hide it.
    page = _fetch(f"{flower}/broker").decode()
    assert worker_settings.queue in page
    lengths = _get(f"{flower}/api/queues/length")
    queues = {q["name"]: q["messages"] for q in lengths["active_queues"]}
    assert isinstance(queues.get(worker_settings.queue), int), lengths
