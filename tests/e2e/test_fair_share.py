"""Fair share and overload with real workers (two workers of two children, as the README
starts them) and a real beat: one user's long steps and thousands of quick ones leave
room for everyone else; waiting is not failing.

No timing is asserted (the machines are shared): what is checked is the order things
finish in and the cap itself (never more of one user's steps running than
AGENTSTATE_USER_STEP_CONCURRENCY); the latencies are recorded as test properties.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from config import Settings
from state.storage.db import read_connection
from state.storage.tables import sessions, steps
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import Workers, make_settings, uid

pytestmark = [pytest.mark.workers]

LONG_STEPS, LONG_S, QUICK_STEPS = 6, 4.0, 1000


@pytest.fixture
def fair_settings(pg_url: str) -> Settings:
    # Default fair-share settings; a queue of the test's own and a sweep every second.
    return make_settings(pg_url, queue=uid("q"), sweep_interval=1.0)


@pytest.fixture
def system(fair_settings: Settings, tmp_path: Path) -> Iterator[AgentClient]:
    pool = Workers(fair_settings, tmp_path, count=2, concurrency=2).start()
    beat = Beat(fair_settings, tmp_path).start()
    try:
        yield AgentClient(fair_settings)
    finally:
        beat.stop()
        pool.stop()


def _session_of(client: AgentClient, user: str) -> str:
    """A session of ``user`` (its workflows are that user's)."""
    session_id = uid("s")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=60)
    return session_id


def _turn_seconds(client: AgentClient, session_id: str, user: str, n: int) -> list[float]:
    took = []
    for i in range(n):
        started = time.perf_counter()
        client.send_message(session_id, f"what is {i + 2}*3?", user_id=user)
        doc = client.wait_for_idle(session_id, timeout=120)
        took.append(time.perf_counter() - started)
        assert str((i + 2) * 3) in doc["message_history"][-1]["content"]
    return took


class _RunningWatch(threading.Thread):
    """Samples how many of one workflow's steps run at once."""

    def __init__(self, client: AgentClient, workflow_id: str) -> None:
        super().__init__(daemon=True)
        self.engine, self.workflow_id = client.backend.engine, workflow_id
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with read_connection(self.engine) as conn:
                running = conn.execute(
                    select(func.count()).where(
                        steps.c.workflow_id == self.workflow_id, steps.c.status == "running"
                    )
                ).scalar_one()
            self.most = max(self.most, int(running))
            time.sleep(0.1)


def test_one_users_load_leaves_room_for_everyone_else(
    system: AgentClient, fair_settings: Settings, record_property: Any
) -> None:
    client = system
    heavy, other, third = uid("heavy"), uid("other"), uid("third")
    heavy_session, other_session = _session_of(client, heavy), _session_of(client, other)
    third_session = _session_of(client, third)
    idle = _turn_seconds(client, other_session, other, 3)

    long_spec = {
        "session_id": heavy_session,
        "steps": [
            {"step_id": f"long{i}", "action": "sleep", "inputs": {"seconds": LONG_S}}
            for i in range(LONG_STEPS)
        ],
    }
    quick_spec = {
        "session_id": heavy_session,
        "steps": [
            {"step_id": f"q{i}", "action": "echo", "inputs": {"i": i}} for i in range(QUICK_STEPS)
        ],
    }
    long_id = client.start_workflow(long_spec)
    watch = _RunningWatch(client, long_id)
    watch.start()
    quick_id = client.start_workflow(quick_spec)
    started = time.perf_counter()
    chain = {
        "session_id": third_session,
        "steps": [
            {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}},
            {
                "step_id": "b",
                "action": "calculate",
                "inputs": {"expression": "a*2"},
                "dependencies": ["a"],
            },
            {
                "step_id": "c",
                "action": "calculate",
                "inputs": {"expression": "b+1"},
                "dependencies": ["b"],
            },
        ],
    }
    third_id = client.start_workflow(chain)
    loaded = _turn_seconds(client, other_session, other, 5)
    third_doc = client.wait_for_workflow(third_id, timeout=300)
    third_s = time.perf_counter() - started
    long_state = client.get_workflow(long_id)
    assert long_state is not None
    # The others were served while the heavy user's long steps still ran.
    assert long_state["status"] == "running"
    assert third_doc["status"] == "success"
    assert third_doc["steps"]["c"]["outputs"] == {"value": 11}
    try:
        long_doc = client.wait_for_workflow(long_id, timeout=300)
    finally:
        watch.stop.set()
        watch.join()
    quick_doc = client.wait_for_workflow(quick_id, timeout=300)
    assert long_doc["status"] == "success" and quick_doc["status"] == "success"
    # The cap: never more of one user's (claimed) steps running than their share.
    assert 1 <= watch.most <= fair_settings.user_step_concurrency
    record_property("idle_turn_p50_s", round(statistics.median(idle), 3))
    record_property("loaded_turn_p50_s", round(statistics.median(loaded), 3))
    record_property("loaded_turn_max_s", round(max(loaded), 3))
    record_property("third_users_workflow_s", round(third_s, 2))


def test_messages_that_wait_for_a_worker_are_answered_not_given_up(
    pg_url: str, tmp_path: Path, record_property: Any
) -> None:
    """No worker for many sweeps (each past STUCK_AFTER, AGENTSTATE_MAX_RECOVERIES 1):
    the waiting messages are sent again now and then, never given up; once workers come,
    each gets its real answer, none an apology."""
    settings = make_settings(
        pg_url, queue=uid("q"), sweep_interval=0.5, stuck_after=1.0, max_recoveries=1
    )
    client, user = AgentClient(settings), uid("u")
    ids = [uid("s") for _ in range(20)]
    beat = Beat(settings, tmp_path).start()
    try:
        for i, session_id in enumerate(ids):
            client.send_message(session_id, f"what is {i}+100?", user_id=user)
        time.sleep(8.0)  # about 16 sweeps, 8 x STUCK_AFTER, with no worker
        pool = Workers(settings, tmp_path, count=2, concurrency=2).start()
        try:
            for i, session_id in enumerate(ids):
                doc = client.wait_for_idle(session_id, timeout=120)
                last = doc["message_history"][-1]
                assert last["metadata"].get("kind") != "apology", last
                assert str(i + 100) in last["content"]
        finally:
            pool.stop()
    finally:
        beat.stop()
    with read_connection(client.backend.engine) as conn:
        resends = conn.execute(
            select(func.sum(sessions.c.resends)).where(sessions.c.session_id.in_(ids))
        ).scalar_one()
    # Backing off, the sweep sent each a few times at most in 8 x STUCK_AFTER.
    record_property("resends_per_message", round(int(resends or 0) / len(ids), 2))
    assert int(resends or 0) <= len(ids) * 4
