"""Agent turns through real `celery -A tasks worker` processes (no eager mode)."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from config import Settings
from state.sessions.snapshot import SessionChange
from state.storage.tables import workflows
from tasks.app import make_app
from tasks.client import AgentClient
from tests.support import Workers, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


def assert_alternating(history: list[dict[str, Any]]) -> None:
    """user, assistant, user, assistant ... and every reply answers the message before it."""
    assert len(history) % 2 == 0, [m["content"] for m in history]
    for user, reply in zip(history[::2], history[1::2], strict=True):
        assert user["role"] == "user" and reply["role"] == "assistant"
        assert reply["metadata"]["reply_to"] == user["metadata"]["message_id"]


def test_twenty_sessions_three_questions_each(client: AgentClient, record_property: Any) -> None:
    user = uid("u")
    sessions = [uid("s") for _ in range(20)]
    questions = {
        s: [(a, b) for a, b in ((i + 2, 7), (i + 3, 11), (i + 4, 13))]
        for i, s in enumerate(sessions)
    }
    started = time.perf_counter()
    for session_id, pairs in questions.items():
        for a, b in pairs:
            client.send_message(session_id, f"what is {a}*{b}?", user_id=user)
    for session_id in sessions:
        client.wait_for_idle(session_id, timeout=120)
    elapsed = time.perf_counter() - started
    for session_id, pairs in questions.items():
        doc = client.get_session(session_id)
        assert doc is not None and doc["phase"] == "idle" and doc["queued"] == 0
        history = doc["message_history"]
        assert_alternating(history)
        replies = [m["content"] for m in history[1::2]]
        assert replies == [f"{a}*{b} = {a * b}" for a, b in pairs]
    record_property("turns_per_second", round(60 / elapsed, 1))
    print(f"\n60 turns over 2 workers: {elapsed:.2f}s, {60 / elapsed:.1f} turns/s")


def test_turn_latency_on_an_idle_system(client: AgentClient, record_property: Any) -> None:
    session_id, user = uid("s"), uid("u")
    latencies = []
    for n in range(10):
        started = datetime.now(UTC)
        client.send_message(session_id, f"what is {n}+1?", user_id=user)
        reply = client.wait_for_idle(session_id, timeout=30)["message_history"][-1]
        assert reply["content"] == f"{n}+1 = {n + 1}"
        # When the reply was committed, not when our polling noticed it.
        latencies.append((datetime.fromisoformat(reply["timestamp"]) - started).total_seconds())
    latencies.sort()
    record_property("turn_latency_p50_ms", round(latencies[5] * 1000, 1))
    print(f"\nturn latency p50 {latencies[5] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")


def test_sixty_messages_from_six_threads_to_one_session(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    sent: list[str] = []
    lock = threading.Lock()

    def send(thread: int) -> None:
        for n in range(10):
            text = f"what is {thread}*{n + 100}?"
            client.send_message(session_id, text, user_id=user)
            with lock:
                sent.append(text)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    doc = client.wait_for_idle(session_id, timeout=180)
    history = doc["message_history"]
    assert len(history) == 120
    assert_alternating(history)
    assert sorted(m["content"] for m in history[::2]) == sorted(sent)  # none lost or doubled
    for question, reply in zip(history[::2], history[1::2], strict=True):
        a, b = map(int, re.findall(r"\d+", question["content"]))
        assert reply["content"] == f"{a}*{b} = {a * b}"
    seqs = [client.inbox.next_queued(session_id)]
    assert seqs == [None]


def test_messages_are_processed_in_arrival_order(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    for n in range(8):
        client.send_message(session_id, f"what is {n}+0?", user_id=user)
    history = client.wait_for_idle(session_id, timeout=60)["message_history"]
    assert [m["content"] for m in history[::2]] == [f"what is {n}+0?" for n in range(8)]


def test_a_phase_task_delivered_twice_is_applied_once(
    client: AgentClient, worker_settings: Settings
) -> None:
    session_id, user = uid("s"), uid("u")
    item = client.inbox.accept(session_id, user, "what is 6*7?")
    snap = client.sessions.load_from_database(session_id)
    assert snap is not None
    # Put the session at `planning`, as if `understanding` had just committed.
    doc = dict(snap.doc)
    doc["context_window"] = {
        "message": item.text,
        "message_id": item.message_id,
        "attempt": 1,
        "intent": {"kind": "calculate", "expressions": ["6*7"]},
    }
    from state.session import make_message

    change = SessionChange(
        phase="planning",
        status="active",
        doc=doc,
        new_messages=[make_message("user", item.text, {"message_id": item.message_id})],
        inbox_state={item.message_id: "started"},
    )
    at_planning = client.sessions.commit(snap, change).snapshot
    app = make_app(worker_settings)
    for _ in range(2):  # the same message, delivered twice (same task id)
        app.send_task(
            "agentstate.phase.planning",
            args=[session_id, at_planning.revision],
            task_id=f"dup-{session_id}",
        )
    app.send_task("agentstate.phase.planning", args=[session_id, at_planning.revision])
    doc_after = client.wait_for_idle(session_id, timeout=30)
    history = doc_after["message_history"]
    assert [m["content"] for m in history] == ["what is 6*7?", "6*7 = 42"]
    # planning, retrieving, executing, evaluating, generating: five commits, each once.
    assert doc_after["revision"] == at_planning.revision + 5


def test_many_kicks_for_one_message_start_one_turn(
    client: AgentClient, worker_settings: Settings
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 1+1?", user_id=user)
    app = make_app(worker_settings)
    for _ in range(10):
        app.send_task("agentstate.phase.understanding", args=[session_id, None])
    doc = client.wait_for_idle(session_id, timeout=30)
    time.sleep(0.5)  # let the extra kicks drain
    doc = client.get_session(session_id)
    assert doc is not None
    assert [m["content"] for m in doc["message_history"]] == ["what is 1+1?", "1+1 = 2"]


def test_memory_spans_sessions_survives_flushdb_and_stays_private(
    client: AgentClient, worker_settings: Settings
) -> None:
    alice, bob = uid("alice"), uid("bob")
    first, second, bobs = uid("s"), uid("s"), uid("s")
    client.send_message(first, "remember that the launch code is 1234", user_id=alice)
    client.wait_for_idle(first, timeout=30)
    redis.Redis.from_url(worker_settings.redis_url).flushdb()  # the cache and locks are gone
    client.send_message(second, "what do you remember?", user_id=alice)
    reply = client.wait_for_idle(second, timeout=30)["message_history"][-1]["content"]
    assert "the launch code is 1234" in reply
    client.send_message(bobs, "what do you remember?", user_id=bob)
    reply = client.wait_for_idle(bobs, timeout=30)["message_history"][-1]["content"]
    assert "1234" not in reply
    assert client.load_user_state(bob) == {}
    assert client.load_user_state(alice)["memories"] == ["the launch code is 1234"]


def test_clarifying_round_trip(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "?!?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "clarifying" and doc["status"] == "paused"
    assert "?" in doc["message_history"][-1]["content"]
    client.send_message(session_id, "what is 9*9?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle" and doc["status"] == "active"
    assert doc["message_history"][-1]["content"] == "9*9 = 81"
    assert doc["metadata"]["turn"]["path"][:2] == ["clarifying", "understanding"]
    assert_alternating(doc["message_history"])


def test_multi_part_question_is_answered_through_a_workflow(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 2+3 and 4*5?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    assert doc["message_history"][-1]["content"] == "2+3 = 5 and 4*5 = 20"
    workflow_id = doc["metadata"]["workflows"][-1]
    workflow = client.get_workflow(workflow_id)
    assert workflow is not None and workflow["session_id"] == session_id
    assert workflow["status"] == "success" and len(workflow["steps"]) == 2


def test_another_users_message_is_refused(client: AgentClient) -> None:
    from state.errors import SessionOwnershipError

    session_id = uid("s")
    client.send_message(session_id, "hello", user_id="owner-1")
    with pytest.raises(SessionOwnershipError):
        client.send_message(session_id, "let me in", user_id="intruder-1")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert all("let me in" not in m["content"] for m in doc["message_history"])


def test_hostile_messages_cost_a_turn_each_and_store_little(client: AgentClient) -> None:
    # Review findings, through real workers: a 64 KiB run of digits held a worker for
    # minutes; 40 KB of sums planned a 9,999-step workflow; 60 KB facts piled up in the
    # user's state.
    session_id, user = uid("s"), uid("u")
    for text in ("1" * 65536, "( " * 32766 + "1", "remember that a" + " " * 65518 + "x"):
        client.send_message(session_id, text, user_id=user)
    client.send_message(session_id, "1+1 " * 9999, user_id=user)
    for _ in range(3):
        client.send_message(session_id, "remember that " + "w" * 60_000, user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    replies = [m["content"] for m in doc["message_history"][1::2]]
    assert len(replies) == 7
    assert [r.startswith("You said:") for r in replies[:2]] == [True, True]
    assert "at most 20 expressions" in replies[3]
    for refused in (2, 4, 5, 6):
        assert replies[refused].startswith("Sorry, I can't remember that")
    with client.backend.engine.connect() as conn:
        count = select(func.count()).select_from(workflows)
        assert conn.execute(count.where(workflows.c.session_id == session_id)).scalar_one() == 0
    assert client.load_user_state(user).get("memories", []) == []
