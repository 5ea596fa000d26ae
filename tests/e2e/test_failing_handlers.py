"""A handler that raises, one that overruns its execution deadline, and handlers that run
past AGENTSTATE_PHASE_TIME_LIMIT (returning late, or not before the test is over)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.agents import HANG_S, PONDER_S
from tests.support import Workers, make_settings, uid

pytestmark = pytest.mark.workers
PHASE_LIMIT_S = 1.0


@pytest.fixture(scope="module")
def faulty_settings(pg_url: str) -> Settings:
    return make_settings(
        pg_url,
        queue=uid("q"),
        agent="tests.agents",
        execution_timeout=1.0,
        phase_time_limit=PHASE_LIMIT_S,
    )


@pytest.fixture(scope="module")
def client(
    faulty_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    # Two worker processes: the deadline check must run while the slow handler sleeps.
    pool = Workers(faulty_settings, tmp_path_factory.mktemp("faulty"), count=2).start()
    yield AgentClient(faulty_settings)
    pool.stop()


def test_a_raising_handler_apologizes_resets_and_the_next_message_works(
    client: AgentClient,
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "please explode", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle"
    assert "sorry" in doc["message_history"][-1]["content"].lower()
    error = doc["metadata"]["last_error"]
    assert error["cause"] == "error" and error["phase"] == "planning"
    assert "exploded on purpose" in error["detail"]
    assert doc["metadata"]["turn"]["path"][-2:] == ["error", "idle"]
    client.send_message(session_id, "what is 3*3?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["content"] == "3*3 = 9"
    assert [m["role"] for m in doc["message_history"]] == ["user", "assistant"] * 2


def test_an_overrunning_handler_times_out_durably(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "dawdle on 2*2", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["phase"] == "idle"
    assert doc["metadata"]["last_error"]["cause"] == "timeout"
    assert doc["metadata"]["turn"]["path"][-2:] == ["timeout", "idle"]
    history = doc["message_history"]
    assert len(history) == 2 and "too long" in history[-1]["content"]
    # The slow handler finishes later; its write must not land.
    client.send_message(session_id, "what is 5*5?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [m["content"] for m in doc["message_history"][2:]] == ["what is 5*5?", "5*5 = 25"]
    time.sleep(2.5)  # the dawdler has woken up and tried to commit by now
    final = client.get_session(session_id)
    assert final is not None and len(final["message_history"]) == 4


def _timed_out_in(doc: dict[str, Any], phase: str) -> None:
    assert doc["phase"] == "idle"
    history = doc["message_history"]
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[-1]["metadata"]["kind"] == "apology" and "too long" in history[-1]["content"]
    error = doc["metadata"]["last_error"]
    assert error["cause"] == "timeout" and error["phase"] == phase
    assert "AGENTSTATE_PHASE_TIME_LIMIT" in error["detail"]
    assert doc["metadata"]["turn"]["path"][-2:] == ["timeout", "idle"]


def test_a_handler_past_the_phase_time_limit_ends_its_turn_once(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "ponder 2*2", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    _timed_out_in(doc, "planning")
    time.sleep(PONDER_S)  # the handler has returned by now; its late result must not land
    later = client.get_session(session_id)
    assert later is not None and later["revision"] == doc["revision"]
    client.send_message(session_id, "what is 5*5?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [m["content"] for m in doc["message_history"][2:]] == ["what is 5*5?", "5*5 = 25"]


def test_a_handler_that_does_not_return_is_ended_by_its_workers_alarm(
    client: AgentClient,
) -> None:
    session_id, user = uid("s"), uid("u")
    started = time.monotonic()
    client.send_message(session_id, "hang on 3*3", user_id=user)
    # Well before the handler returns (HANG_S), and without waiting out a lock TTL.
    doc = client.wait_for_idle(session_id, timeout=HANG_S / 2)
    assert time.monotonic() - started < HANG_S / 2
    _timed_out_in(doc, "retrieving")
    client.send_message(session_id, "what is 6*6?", user_id=user)  # the other worker
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [m["content"] for m in doc["message_history"][2:]] == ["what is 6*6?", "6*6 = 36"]
    time.sleep(max(0.0, started + HANG_S + 1.0 - time.monotonic()))  # the handler returned
    final = client.get_session(session_id)
    assert final is not None and len(final["message_history"]) == 4
    assert final["revision"] == doc["revision"]
