"""A turn waiting on its workflow outlives the loss of the step's worker: the worker is
SIGKILLed mid-step (main process and children: the broker keeps its message until the
visibility timeout), the sweep recovers the step once its lease runs out, and the turn
answers with its real reply, not "that took too long".

Settings keep the defaults' order: the turn's execution deadline comes before
AGENTSTATE_STUCK_AFTER (30 s vs 60 s by default; 5 s vs 6 s here, to stay short).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from config import Settings
from state.storage.db import read_connection
from state.storage.tables import steps, workflows
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import Workers, make_settings, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture
def kill_settings(pg_url: str) -> Settings:
    return make_settings(
        pg_url,
        queue=uid("q"),
        agent="tests.agents",
        execution_timeout=5.0,
        stuck_after=6.0,
        sweep_interval=0.5,
    )


def _running_step(client: AgentClient, session_id: str, timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        with read_connection(client.backend.engine) as conn:
            running = conn.execute(
                select(steps.c.step_id)
                .join(workflows, workflows.c.workflow_id == steps.c.workflow_id)
                .where(workflows.c.session_id == session_id, steps.c.status == "running")
            ).first()
        if running is not None:
            return
        time.sleep(0.05)
    raise TimeoutError("the workflow's step never ran")


def test_a_turn_waiting_on_its_workflow_survives_the_steps_worker_being_killed(
    kill_settings: Settings, tmp_path: Path
) -> None:
    pool = Workers(kill_settings, tmp_path, count=1, concurrency=2).start()
    beat = Beat(kill_settings, tmp_path).start()
    try:
        client, user, session_id = AgentClient(kill_settings), uid("u"), uid("s")
        client.send_message(session_id, "slowflow please", user_id=user)
        _running_step(client, session_id)
        (worker,) = pool.alive()
        pool.kill(worker)  # the step's run is lost with its worker, message and all
        pool.add()
        pool.wait_ready()
        doc = client.wait_for_idle(session_id, timeout=120)
    finally:
        beat.stop()
        pool.stop()
    last = doc["message_history"][-1]
    assert last["role"] == "assistant"
    assert last["metadata"].get("kind") not in ("apology", "timeout"), last
    assert "took too long" not in last["content"]
    assert "last_error" not in doc["metadata"], doc["metadata"].get("last_error")
