"""Run control under faults: a workflow cancelled while the worker running its step is
SIGKILLed, and a timer step whose message is lost with a flushed broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from config import HopPolicy, Settings
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.faults.helpers import fault_settings
from tests.services import Beat
from tests.support import Workers, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture
def settings(pg_url: str) -> Settings:
    return fault_settings(pg_url, HopPolicy.EVERY_PHASE)


@pytest.fixture
def beat(settings: Settings, tmp_path: Path) -> Iterator[Beat]:
    running = Beat(settings, tmp_path).start()
    yield running
    running.stop()


def _wait(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def test_a_workflow_cancelled_while_its_worker_is_killed_runs_nothing_more(
    settings: Settings, beat: Beat, tmp_path: Path
) -> None:
    pool = Workers(settings, tmp_path, count=2).start()
    try:
        client = AgentClient(settings)
        effects = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        run = uid("run")
        steps = [
            {"step_id": "slow", "action": "slow_count", "inputs": {"name": "slow", "seconds": 3}},
            {
                "step_id": "after",
                "action": "count",
                "inputs": {"name": "after"},
                "dependencies": ["slow"],
            },
        ]
        workflow_id = client.start_workflow({"context": {"run": run}, "steps": steps})
        _wait(lambda: client.get_workflow(workflow_id)["steps"]["slow"]["status"] == "running")  # type: ignore[index]
        for name in pool.alive():
            pool.kill(name)  # the step's task goes back to the queue (acks_late)
        doc = client.cancel_workflow(workflow_id)
        assert doc["status"] == "cancelled"
        pool.add()
        pool.add()
        pool.wait_ready()
        time.sleep(6.0)  # redelivery, the sweep (every second) and the lease all pass by
        final = client.get_workflow(workflow_id)
        assert final is not None and final["status"] == "cancelled"
        assert {s["status"] for s in final["steps"].values()} == {"skipped"}
        counts = effects.hgetall(effects_key(run))
        assert "slow" not in counts and "after" not in counts
    finally:
        pool.stop()


def test_a_timer_survives_a_flushed_broker(settings: Settings, beat: Beat, tmp_path: Path) -> None:
    pool = Workers(settings, tmp_path, count=1).start()
    try:
        client = AgentClient(settings)
        spec = {"steps": [{"step_id": "t", "action": "echo", "not_before_s": 2.0}]}
        workflow_id = client.start_workflow(spec)
        time.sleep(0.5)  # the first delivery armed the timer and re-queued itself
        redis.Redis.from_url(settings.broker_url).flushdb()
        doc = client.wait_for_workflow(workflow_id, timeout=60)
        assert doc["status"] == "success"
    finally:
        pool.stop()
