"""Schedules and webhooks with real workers and two real beat processes: every tick fires
exactly once through a beat restart and a worker SIGKILL; a receiver that answers 500 twice
gets exactly three attempts under one webhook-id; a receiver that is down while a worker
is killed still gets the delivery once it is up."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import REPO, Workers, make_settings, settings_env, uid
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.faults, pytest.mark.workers]

EVERY_S = 3
WAIT_S = 120.0


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return make_settings(
        pg_url,
        queue=uid("q"),
        action_modules="tests.actions_for_tests",
        stuck_after=3.0,
        sweep_interval=1.0,
        max_recoveries=20,
        webhook_allow_private=True,
        webhook_retry_base_seconds=0.5,
        webhook_timeout=2.0,
    )


@pytest.fixture(scope="module")
def system(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentClient, Workers, list[Beat]]]:
    pool = Workers(settings, tmp_path_factory.mktemp("workers"), count=2).start()
    beats = [Beat(settings, tmp_path_factory.mktemp(f"beat{n}")).start() for n in (1, 2)]
    try:
        yield AgentClient(settings), pool, beats
    finally:
        for beat in beats:
            beat.stop()
        pool.stop()


def wait_until(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"{what} after {timeout:g}s")


def test_three_attempts_one_webhook_id(system: tuple[AgentClient, Workers, list[Beat]]) -> None:
    client, _, _ = system
    receiver = Receiver(script=[500, 500]).start()
    try:
        user = uid("u")
        hook = client.add_webhook(receiver.url, ["turn.completed"], user_id=user)
        receiver.secret = hook["secret"]
        session = uid("s")
        client.send_message(session, "what is 2+3?", user_id=user)
        client.wait_for_idle(session, timeout=60)
        wait_until(
            lambda: client.webhook_deliveries(hook["webhook_id"])[0]["status"] == "delivered",
            "the delivery was not delivered",
        )
        assert [r.answered for r in receiver] == [500, 500, 200]
        (delivery,) = client.webhook_deliveries(hook["webhook_id"])
        assert set(receiver.ids()) == {delivery["delivery_id"]}
        bodies = [r.verified for r in receiver]
        assert all(isinstance(b, dict) for b in bodies), bodies
        assert bodies[0]["type"] == "turn.completed"
        assert bodies[0]["data"]["session_id"] == session
        assert [a.get("status_code") for a in delivery["attempts"]] == [500, 500, 200]
    finally:
        receiver.stop()


def test_a_receiver_down_while_a_worker_is_killed_gets_it_once_up(
    system: tuple[AgentClient, Workers, list[Beat]],
) -> None:
    client, pool, _ = system
    receiver = Receiver()  # not listening yet
    user = uid("u")
    hook = client.add_webhook(receiver.url, ["turn.completed"], user_id=user)
    receiver.secret = hook["secret"]
    session = uid("s")
    client.send_message(session, "what is 4*5?", user_id=user)
    client.wait_for_idle(session, timeout=60)
    wait_until(
        lambda: client.webhook_deliveries(hook["webhook_id"])[0]["attempts"],
        "no attempt was made",
    )
    killed = pool.alive()[0]
    pool.kill(killed)  # SIGKILL, main process and children
    pool.add()
    receiver.start()
    try:
        wait_until(lambda: receiver.received, "the receiver got nothing once up")
        wait_until(
            lambda: client.webhook_deliveries(hook["webhook_id"])[0]["status"] == "delivered",
            "the delivery was not recorded delivered",
        )
        (delivery,) = client.webhook_deliveries(hook["webhook_id"])
        assert set(receiver.ids()) == {delivery["delivery_id"]}
        assert all(isinstance(r.verified, dict) for r in receiver)
        assert any("error" in a for a in delivery["attempts"])  # it was down at first
    finally:
        receiver.stop()


def test_each_tick_fires_once_through_a_beat_restart_and_a_worker_kill(
    system: tuple[AgentClient, Workers, list[Beat]],
) -> None:
    client, pool, beats = system
    user = uid("u")
    sessions = [uid("s"), uid("s")]
    schedules = [uid("say"), uid("say"), uid("flow")]
    for schedule_id, session_id in zip(schedules, sessions, strict=False):
        client.create_schedule(
            schedule_id,
            every_seconds=EVERY_S,
            user_id=user,
            session_id=session_id,
            text="what is 6*7?",
            overlap="enqueue",
        )
    spec = {"steps": [{"step_id": "a", "action": "echo", "inputs": {"n": 1}}]}
    client.create_schedule(
        schedules[2], every_seconds=EVERY_S, user_id=user, workflow=spec, overlap="enqueue"
    )

    def runs_at_least(count: int) -> bool:
        return all(len(client.schedule_runs(s, limit=1000)) >= count for s in schedules)

    wait_until(lambda: runs_at_least(3), "the schedules did not tick")
    beats[0].stop()  # a beat restart, while the other keeps looking
    beats[0].start()
    wait_until(lambda: runs_at_least(6), "ticks stopped after the beat restart")
    pool.kill(pool.alive()[0])  # a worker SIGKILLed, whatever it was doing
    pool.add()
    wait_until(lambda: runs_at_least(10), "ticks stopped after the worker kill")
    for schedule_id in schedules:
        client.pause_schedule(schedule_id, user_id=user)
    for schedule_id, session_id in zip(schedules, sessions, strict=False):
        runs = client.schedule_runs(schedule_id, limit=1000)
        assert_contiguous(runs)
        doc = client.wait_for_idle(session_id, timeout=WAIT_S)
        history = doc["message_history"]
        assert [m["role"] for m in history] == ["user", "assistant"] * len(runs)
        assert {m["metadata"]["message_id"] for m in history[::2]} == {
            r["message_id"] for r in runs
        }
        assert all(m["content"] == "6*7 = 42" for m in history[1::2])
    flows = client.schedule_runs(schedules[2], limit=1000)
    assert_contiguous(flows)
    for run in flows:
        assert run["workflow_id"] == f"{schedules[2]}:{run['tick']}"
        assert client.wait_for_workflow(run["workflow_id"], timeout=WAIT_S)["status"] == "success"
    listed = client.list_workflows(user_id=user, limit=200)["items"]
    assert len(listed) == len(flows)


@pytest.mark.parametrize(
    ("example", "prints"),
    [
        ("schedules.py", ["['fired', 'fired']", "6*7 = 42"]),
        ("webhooks.py", ["turn.completed True", "True"]),
    ],
)
def test_the_examples_run(
    system: tuple[AgentClient, Workers, list[Beat]],
    settings: Settings,
    example: str,
    prints: list[str],
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        cwd=tmp_path,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-len(prints) :] == prints, result.stdout


def assert_contiguous(runs: list[dict[str, Any]]) -> None:
    """Fired, newest first, one per tick, none missing between the first and the last."""
    assert runs and all(r["status"] == "fired" for r in runs), runs
    ticks = [datetime.fromisoformat(r["tick"].replace("Z", "+00:00")) for r in runs]
    gaps = {(a - b).total_seconds() for a, b in pairwise(ticks)}
    assert gaps == {float(EVERY_S)}, [r["tick"] for r in runs]
