"""Work that starts itself: a message every 2 seconds to a session, and a workflow every
weekday at 09:00 in Paris; each tick fires exactly once, and the schedule keeps its log.

Run it next to workers and `celery -A tasks beat` (docs/guides/schedules.md):

    python examples/schedules.py

tests/faults/test_schedule_faults.py runs it against real workers and two beats.
"""

from __future__ import annotations

import time
import uuid

from tasks.client import AgentClient


def main() -> None:
    agent = AgentClient()
    user, session = f"alice-{uuid.uuid4().hex[:8]}", f"daily-{uuid.uuid4().hex[:8]}"
    hello = agent.create_schedule(
        f"hello-{uuid.uuid4().hex[:8]}",
        every_seconds=2,
        user_id=user,
        session_id=session,
        text="what is 6*7?",
    )
    report = agent.create_schedule(
        f"report-{uuid.uuid4().hex[:8]}",
        "0 9 * * 1-5",  # minute hour day-of-month month day-of-week
        timezone="Europe/Paris",
        user_id=user,
        workflow={
            "steps": [{"step_id": "sum", "action": "calculate", "inputs": {"expression": "2+3"}}]
        },
    )
    print("next report at", report["next_tick"][11:16], "UTC")  # 07:00 or 08:00: DST

    while len(agent.schedule_runs(hello["schedule_id"], user_id=user)) < 2:
        time.sleep(0.2)
    agent.pause_schedule(hello["schedule_id"], user_id=user)
    runs = agent.schedule_runs(hello["schedule_id"], user_id=user)  # newest first
    print([run["status"] for run in runs][-2:])  # ['fired', 'fired']
    doc = agent.wait_for_idle(session, user_id=user)
    print(doc["message_history"][1]["content"])  # 6*7 = 42
    for schedule in (hello, report):
        agent.delete_schedule(schedule["schedule_id"], user_id=user)


if __name__ == "__main__":
    main()
