"""Bad input gets one clear, typed error and changes nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from config import Settings
from state.errors import (
    InvalidIdError,
    InvalidPayloadError,
    MessageTooLargeError,
    NotFoundError,
    SessionOwnershipError,
    WorkflowSpecError,
)
from state.storage import keys
from state.storage.tables import inbox, sessions
from tasks.app import make_app
from tasks.client import AgentClient
from tests.support import Workers, uid

pytestmark = pytest.mark.workers
INF = float("inf")
BAD_IDS = ["", "x" * 129, "has space", "slash/no", "semi;colon", "caf\u00e9", "brace{x}", None, 42]


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings.model_copy(update={"max_message_bytes": 100}))


def _rows(client: AgentClient) -> tuple[int, int]:
    with client.backend.engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(sessions)).scalar_one(),
            conn.execute(select(func.count()).select_from(inbox)).scalar_one(),
        )


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_ids_are_refused_everywhere_and_store_nothing(client: AgentClient, bad: object) -> None:
    before = _rows(client)
    calls = [
        lambda: client.send_message(bad, "hi", user_id="u-1"),  # type: ignore[arg-type]
        lambda: client.send_message("s-1", "hi", user_id=bad),  # type: ignore[arg-type]
        lambda: client.get_session(bad),  # type: ignore[arg-type]
        lambda: client.wait_for_idle(bad),  # type: ignore[arg-type]
        lambda: client.get_workflow(bad),  # type: ignore[arg-type]
        lambda: client.save_user_state(bad, {}),  # type: ignore[arg-type]
        lambda: client.load_user_state(bad),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidIdError, match=r"invalid .* id"):
            call()
    assert _rows(client) == before


def test_oversized_messages_are_refused_and_store_nothing(client: AgentClient) -> None:
    before = _rows(client)
    with pytest.raises(MessageTooLargeError, match="101 bytes; the limit is 100"):
        client.send_message(uid("s"), "x" * 101, user_id="u-1")
    with pytest.raises(MessageTooLargeError):  # bytes, not characters: 34 x 3 = 102
        client.send_message(uid("s"), "\u20ac" * 34, user_id="u-1")
    assert _rows(client) == before


def test_non_json_payloads_are_refused(client: AgentClient) -> None:
    user = uid("u")
    with pytest.raises(InvalidPayloadError):
        client.send_message(uid("s"), b"bytes", user_id=user)  # type: ignore[arg-type]
    with pytest.raises(InvalidPayloadError):
        client.save_user_state(user, ["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(InvalidPayloadError):
        client.save_user_state(user, {"a set": {1, 2}})
    assert client.load_user_state(user) == {}


def test_non_finite_numbers_are_refused_not_stored_as_null(client: AgentClient) -> None:
    user, workflow_id = uid("u"), uid("wf")
    with pytest.raises(InvalidPayloadError, match="not finite"):
        client.save_user_state(user, {"score": float("nan")})
    assert client.load_user_state(user) == {}
    inputs = {"step_id": "a", "action": "echo", "inputs": {"x": -INF}}
    with pytest.raises(WorkflowSpecError, match="'inputs' contains a number that is not finite"):
        client.start_workflow({"workflow_id": workflow_id, "steps": [inputs]})
    context = {"step_id": "a", "action": "echo"}
    with pytest.raises(WorkflowSpecError, match="'context' contains a number that is not finite"):
        client.start_workflow(
            {"workflow_id": workflow_id, "steps": [context], "context": {"x": [INF]}}
        )
    assert client.get_workflow(workflow_id) is None
    # An action's outputs: the step fails instead of storing null.
    steps = [{"step_id": "a", "action": "not_finite", "inputs": {"value": "inf"}, "max_retries": 0}]
    doc = client.wait_for_workflow(client.start_workflow({"steps": steps}), timeout=30)
    step = doc["steps"]["a"]
    assert step["status"] == "failed"
    assert "outputs of action 'not_finite' contains a number that is not finite" in step["error"]
    assert not step["outputs"]


def test_unknown_sessions_and_workflows(client: AgentClient) -> None:
    assert client.get_session(uid("nobody")) is None
    assert client.get_workflow(uid("nowf")) is None
    with pytest.raises(NotFoundError):
        client.wait_for_idle(uid("nobody"), timeout=1)
    with pytest.raises(NotFoundError):
        client.wait_for_workflow(uid("nowf"), timeout=1)


def test_a_session_of_another_user_is_refused(client: AgentClient) -> None:
    session_id = uid("s")
    client.send_message(session_id, "what is 1+2?", user_id="alice-1")
    before = _rows(client)
    with pytest.raises(SessionOwnershipError):
        client.send_message(session_id, "what is 3+4?", user_id="mallory-1")
    assert _rows(client) == before
    history = client.wait_for_idle(session_id, timeout=30)["message_history"]
    assert [m["content"] for m in history] == ["what is 1+2?", "1+2 = 3"]


def test_a_corrupted_session_is_quarantined_not_a_crash_loop(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 2+2?", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(sessions)
            .where(sessions.c.session_id == session_id)
            .values(
                doc=json.dumps({"_version": 3, "metadata": "not a dict"}),
                revision=sessions.c.revision + 1,
            )
        )
    client.send_message(session_id, "what is 3+3?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["content"] == "3+3 = 6"
    assert len(doc["message_history"]) == 4  # the history rows were never touched


class _Exploit:
    """Unpickling this would create a file: proof that a pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_message_is_refused_never_executed(
    worker_settings: Settings, workers: Workers, client: AgentClient, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    counter = f"test:pickle:{uid('k')}"
    app = make_app(worker_settings)
    app.send_task("agentstate.baseline.noop", args=[counter, _Exploit(marker)], serializer="pickle")
    app.send_task("agentstate.baseline.noop", args=[counter], serializer="pickle")
    time.sleep(1.5)
    assert not marker.exists()
    redis_client = client.backend.redis
    counted = keys.baseline_counter(counter)
    assert redis_client.get(counted) is None  # never executed
    app.send_task("agentstate.baseline.noop", args=[counter])  # JSON still works
    deadline = time.monotonic() + 10
    while redis_client.get(counted) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert redis_client.get(counted) == b"1"
    assert "untrusted content" in workers.logs() or "ContentDisallowed" in workers.logs()
