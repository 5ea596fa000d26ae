"""Workers killed, children killed, holders stopped: nothing lost, nothing doubled."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from config import Settings
from state.errors import QuotaExceededError
from state.storage.tables import sessions
from tasks.client import AgentClient
from tests.actions_for_tests import effects_key
from tests.agents import vanish_key
from tests.faults.helpers import HOP_POLICIES, assert_answered_exactly_once, running, wait_all_idle
from tests.faults.helpers import fault_settings as make_fault_settings
from tests.services import Beat
from tests.support import Workers, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture(params=HOP_POLICIES)
def fault_settings(pg_url: str, request: pytest.FixtureRequest) -> Settings:
    """Every fault test runs under both hop policies: the guarantees must not depend on it."""
    return make_fault_settings(pg_url, request.param)


@pytest.fixture
def beat(fault_settings: Settings, tmp_path: Path) -> Iterator[Beat]:
    running = Beat(fault_settings, tmp_path).start()
    yield running
    running.stop()


def _wait_phase(client: AgentClient, session_id: str, phase: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = client.sessions.load_from_database(session_id)
        if snap is not None and snap.phase == phase:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{session_id} never reached {phase}")


def test_sigkill_whole_workers_three_times_loses_and_doubles_nothing(
    fault_settings: Settings, beat: Beat, tmp_path: Path
) -> None:
    pool = Workers(fault_settings, tmp_path, count=2).start()
    try:
        client = AgentClient(fault_settings)
        user, sessions = uid("u"), [uid("s") for _ in range(30)]
        sent: dict[str, list[str]] = {s: [] for s in sessions}
        rng = random.Random(11)
        for wave in range(3):
            for i, session_id in enumerate(sessions):
                text = f"what is {wave + 2}*{i + 10}?"
                client.send_message(session_id, text, user_id=user)
                sent[session_id].append(text)
            time.sleep(rng.uniform(0.2, 0.6))  # turns are in flight
            pool.kill(pool.alive()[0])  # main process and children, no goodbye
            pool.add()
            pool.wait_ready()
        wait_all_idle(client, sessions, timeout=180)
        assert assert_answered_exactly_once(client, sent) == 90
    finally:
        pool.stop()


def test_sigkill_of_a_pool_child_mid_task_is_redelivered_and_applied_once(
    fault_settings: Settings, tmp_path: Path
) -> None:
    pool = Workers(fault_settings, tmp_path, count=1).start()
    try:
        client = AgentClient(fault_settings)
        session_id, user = uid("s"), uid("u")
        client.send_message(session_id, "linger over 6*7", user_id=user)
        _wait_phase(client, session_id, "executing")
        time.sleep(0.3)  # inside the 2 s handler
        (name,) = pool.alive()
        children = pool.children(name)
        assert children
        for pid in children:
            os.kill(pid, signal.SIGKILL)  # the main process lives and requeues the task
        doc = client.wait_for_idle(session_id, timeout=60)
        assert [m["content"] for m in doc["message_history"]] == ["linger over 6*7", "6*7 = 42"]
        assert doc["metadata"]["turn"]["path"].count("executing") == 1
    finally:
        pool.stop()


def test_a_stopped_lock_holder_is_overtaken_and_its_late_write_refused(
    fault_settings: Settings, beat: Beat, tmp_path: Path
) -> None:
    first = Workers(fault_settings, tmp_path, count=1).start()
    second = Workers(fault_settings, tmp_path, count=1)
    second.tag = "second"
    try:
        client = AgentClient(fault_settings)
        session_id, user = uid("s"), uid("u")
        client.send_message(session_id, "linger over 8*8", user_id=user)
        _wait_phase(client, session_id, "executing")
        (name,) = first.alive()
        stopped = first.children(name)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)  # its lock renewal stops too
        second.start()  # the sweep hands the stuck phase to this worker
        doc = client.wait_for_idle(session_id, timeout=60)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        time.sleep(3.0)  # the stopped handler finishes and tries to commit
        doc = client.get_session(session_id)
        assert doc is not None
        assert [m["content"] for m in doc["message_history"]] == ["linger over 8*8", "8*8 = 64"]
        assert doc["phase"] == "idle"
        client.send_message(session_id, "what is 2*2?", user_id=user)
        doc = client.wait_for_idle(session_id, timeout=30)
        assert [m["content"] for m in doc["message_history"]][2:] == ["what is 2*2?", "2*2 = 4"]
    finally:
        first.stop()
        second.stop()


def test_a_workflow_survives_its_worker_being_killed_mid_step(
    fault_settings: Settings, beat: Beat, tmp_path: Path
) -> None:
    pool = Workers(fault_settings, tmp_path, count=2).start()
    try:
        client = AgentClient(fault_settings)
        run = uid("run")
        steps = [
            {
                "step_id": f"s{i}",
                "action": "slow_count",
                "inputs": {"name": f"s{i}", "seconds": 0.6},
                "dependencies": [] if i < 4 else [f"s{i - 4}"],
            }
            for i in range(12)
        ]
        workflow_id = client.start_workflow({"context": {"run": run}, "steps": steps})
        time.sleep(0.9)
        pool.kill(pool.alive()[0])
        pool.add()
        pool.wait_ready()
        doc = client.wait_for_workflow(workflow_id, timeout=120)
        assert doc["status"] == "success"
        assert all(s["status"] == "success" for s in doc["steps"].values())
        effects = redis.Redis.from_url(fault_settings.redis_url, decode_responses=True)
        counts = effects.hgetall(effects_key(run))
        assert counts == {f"s{i}": "1" for i in range(12)}
    finally:
        pool.stop()


class _Feeder(threading.Thread):
    """Keeps the broker's queue busy with arithmetic for other sessions, recording what it
    sent and the largest backlog it saw."""

    def __init__(self, client: AgentClient, sessions: list[str], low_water: int = 20) -> None:
        super().__init__(daemon=True)
        self.client, self.sessions, self.low_water = client, sessions, low_water
        self.sent: dict[str, list[str]] = {s: [] for s in sessions}
        self.user = uid("u")
        self.stop = threading.Event()
        self.busiest = 0

    def run(self) -> None:
        wave = 0
        while not self.stop.is_set():
            backlog = self.client.dispatcher.backlog() or 0
            self.busiest = max(self.busiest, backlog)
            if backlog >= self.low_water:
                time.sleep(0.05)
                continue
            for i, session_id in enumerate(self.sessions):
                text = f"what is {wave + 2}*{i + 3}?"
                try:
                    self.client.send_message(session_id, text, user_id=self.user)
                except QuotaExceededError:
                    continue  # its inbox is full (AGENTSTATE_MAX_QUEUED_MESSAGES): busy enough
                self.sent[session_id].append(text)
            wave += 1


def test_a_turn_that_kills_its_worker_gets_an_apology_while_the_queue_stays_busy(
    fault_settings: Settings, tmp_path: Path, record_property: Any
) -> None:
    settings = fault_settings.model_copy(update={"max_recoveries": 3})
    with running(settings, tmp_path) as (client, _pool):
        feeder = _Feeder(client, [uid("busy") for _ in range(8)])
        feeder.start()
        try:
            session_id, user = uid("s"), uid("u")
            started = time.monotonic()
            client.send_message(session_id, "please vanish", user_id=user)
            doc = client.wait_for_idle(session_id, timeout=120)
            record_property("poison_seconds", round(time.monotonic() - started, 1))
        finally:
            feeder.stop.set()
            feeder.join()
        assert feeder.busiest > 0  # the queue was never empty for long: no waiting it out
        history = doc["message_history"]
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[-1]["metadata"]["kind"] == "apology"
        assert "gave up after" in doc["metadata"]["last_error"]["detail"]
        runs = int(client.backend.redis.get(vanish_key(session_id)) or 0)
        record_property("poison_runs", runs)
        record_property("busiest_backlog", feeder.busiest)
        # Each loss the broker redelivers counts. The sweep may also send copies (it cannot
        # tell lost work from queued work, so it counts none, and backs off): each can add
        # one run, never more than it sent.
        with client.backend.engine.connect() as conn:
            query = select(sessions.c.resends).where(sessions.c.session_id == session_id)
            copies = int(conn.execute(query).scalar_one())
        record_property("sweep_copies", copies)
        assert 2 <= runs <= settings.max_recoveries + 1 + copies, (runs, copies)
        assert copies <= 3  # backing off: STUCK_AFTER, then 2x, 4x ...
        wait_all_idle(client, feeder.sessions, timeout=180)
        assert assert_answered_exactly_once(client, feeder.sent) > 0


def test_a_quick_workflow_survives_its_worker_being_killed_mid_step(
    fault_settings: Settings, beat: Beat, tmp_path: Path
) -> None:
    """Steps of a quick action (read, run, one commit; no claim) while a whole worker is
    SIGKILLed: a run it held is delivered again (or sent again by the sweep), every step
    commits once (a chain of sums comes out right) and nothing is lost."""
    pool = Workers(fault_settings, tmp_path, count=2).start()
    try:
        client = AgentClient(fault_settings)
        run = uid("run")
        steps = [
            {
                "step_id": f"q{i}",
                "action": "quick_count",
                "inputs": {"name": f"q{i}", "seconds": 0.4},
                "dependencies": [] if i < 4 else [f"q{i - 4}"],
            }
            for i in range(12)
        ]
        workflow_id = client.start_workflow({"context": {"run": run}, "steps": steps})
        time.sleep(0.6)
        pool.kill(pool.alive()[0])
        pool.add()
        pool.wait_ready()
        doc = client.wait_for_workflow(workflow_id, timeout=120)
        assert doc["status"] == "success"
        outputs = {sid: s["outputs"]["value"] for sid, s in doc["steps"].items()}
        assert outputs == {f"q{i}": 1 + i // 4 for i in range(12)}  # a chain of sums
        effects = redis.Redis.from_url(fault_settings.redis_url, decode_responses=True)
        runs = {name: int(n) for name, n in effects.hgetall(effects_key(run)).items()}
        assert set(runs) == {f"q{i}" for i in range(12)} and all(n >= 1 for n in runs.values())
    finally:
        pool.stop()
