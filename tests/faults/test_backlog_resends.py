"""A backlog is not re-sent (issue #40), with a real worker of one child and a real beat:
a burst of sessions x 2 messages waits far longer than AGENTSTATE_STUCK_AFTER (3 s,
sweeping every second). The sweep finds that work untouched, but the broker still holds
its messages (the oldest queued one was sent after it): nothing is sent again. Every
message is answered once, none with an apology, and the worker runs no more phase and
step tasks than the same burst with no sweep at all (the calibration).

Counts, not times, are asserted; the figures are printed and recorded.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from state.storage.db import read_connection
from state.storage.tables import sessions, steps, workflows
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import Workers, make_settings, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]

SESSIONS = 200  # x 2 messages: the tail waits several times STUCK_AFTER on one child
# What the worker logs for each phase or step task it ran (whatever its outcome).
_RAN = re.compile(r"Task agentstate\.(?:phase\.\w+|workflow\.step)\[[^\]]+\] (?:succeeded|raised)")


def _burst(pg_url: str, log_dir: Path, *, sweep: bool) -> tuple[int, int, float]:
    """Send the burst to one worker of one child (with the sweep, or none); wait for every
    answer and check it. The phase and step tasks run, re-sends noted, and seconds."""
    settings = make_settings(pg_url, queue=uid("q"), stuck_after=3.0, sweep_interval=1.0)
    log_dir.mkdir()
    client, user = AgentClient(settings), uid("u")
    ids = [uid("s") for _ in range(SESSIONS)]
    pool = Workers(settings, log_dir, count=1, concurrency=1).start()
    beat = Beat(settings, log_dir).start() if sweep else None
    started = time.perf_counter()
    try:
        for i, session_id in enumerate(ids):
            client.send_message(session_id, f"what is {i}+100?", user_id=user)
            client.send_message(session_id, f"what is {i}+200?", user_id=user)
        for i, session_id in enumerate(ids):
            doc = client.wait_for_idle(session_id, timeout=600)
            replies = [m for m in doc["message_history"] if m["role"] == "assistant"]
            # Each message answered once, with its real answer.
            assert len(replies) == 2, replies
            assert str(i + 100) in replies[0]["content"], replies
            assert str(i + 200) in replies[1]["content"], replies
            assert all(m["metadata"].get("kind") != "apology" for m in replies)
    finally:
        took = time.perf_counter() - started
        if beat is not None:
            beat.stop()
        pool.stop()
    return _ran(log_dir), _resends(client, ids), took


def _ran(log_dir: Path) -> int:
    return sum(len(_RAN.findall(p.read_text(errors="replace"))) for p in log_dir.glob("w*.log"))


def _resends(client: AgentClient, ids: list[str]) -> int:
    with read_connection(client.backend.engine) as conn:
        of_sessions = conn.execute(
            select(func.coalesce(func.sum(sessions.c.resends), 0)).where(
                sessions.c.session_id.in_(ids)
            )
        ).scalar_one()
        of_steps = conn.execute(
            select(func.coalesce(func.sum(steps.c.resends), 0))
            .join(workflows, workflows.c.workflow_id == steps.c.workflow_id)
            .where(workflows.c.session_id.in_(ids))
        ).scalar_one()
    return int(of_sessions) + int(of_steps)


def test_a_backlog_waiting_in_the_queue_is_not_sent_again(
    pg_url: str, tmp_path: Path, record_property: Any
) -> None:
    calibration, _, calm_s = _burst(pg_url, tmp_path / "calm", sweep=False)
    ran, resends, swept_s = _burst(pg_url, tmp_path / "swept", sweep=True)
    figures = {
        "turns": 2 * SESSIONS,
        "tasks_without_sweep": calibration,
        "tasks_with_sweep": ran,
        "resends": resends,
        "seconds_without_sweep": round(calm_s, 1),
        "seconds_with_sweep": round(swept_s, 1),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\nbacklog: {figures}")
    # The tail waited several times STUCK_AFTER, yet nothing merely queued was re-sent.
    assert resends == 0
    # Tasks run beyond the calibration: none are re-sends (above); on a loaded machine a
    # phase that waits out its lock is retried by its task, which adds runs (a run of the
    # whole suite in two processes saw 1.21x). Before the fix the sweep alone made 2.5x.
    assert ran <= calibration * 1.5
