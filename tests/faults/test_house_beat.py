"""Workers alone, no ``celery beat``: a message whose enqueue was lost is answered by the
sweep the workers send themselves, and a schedule ticks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from config import HopPolicy
from tasks.client import AgentClient
from tests.faults.helpers import fault_settings
from tests.integration.test_turn_engine import engine_for
from tests.support import Workers, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


def test_workers_alone_answer_a_lost_enqueue_and_fire_schedules(
    pg_url: str, tmp_path: Path
) -> None:
    settings = fault_settings(pg_url, HopPolicy.INLINE, worker_beat=True, tick_interval=1.0)
    user, lost, ticking = uid("u"), uid("lost"), uid("tick")
    # Accepted, but its kick never reached the broker (as when the broker was down).
    engine, _dropped = engine_for(settings, agent="tests.agents")
    engine.services.inbox.accept(lost, user, "what is 6*7?")
    client = AgentClient(settings)
    client.create_schedule(uid("sch"), every_seconds=1, user_id=user, session_id=ticking, text="hi")
    pool = Workers(settings, tmp_path, count=2).start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            answered = client.get_session(lost, user_id=user)
            ticked = client.get_session(ticking, user_id=user)
            if answered and answered["message_history"] and ticked and ticked["message_history"]:
                break
            time.sleep(0.5)
        answered = client.get_session(lost, user_id=user)
        assert answered is not None
        assert answered["message_history"][0]["content"] == "what is 6*7?"
        assert answered["message_history"][-1]["role"] == "assistant"
        ticked = client.get_session(ticking, user_id=user)
        assert ticked is not None and ticked["message_history"][0]["content"] == "hi"
    finally:
        pool.stop()
