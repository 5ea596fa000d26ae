"""Retention through real workers and Postgres: data aged past settings given in
fractions of a day is all gone after one `agentstate prune`, however much is due, and a
fresh session is whole."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from config import Settings
from state.clock import utcnow
from state.lifecycle import retention
from state.lifecycle.retention import DELETABLE_PHASES
from state.storage.tables import approvals, events, revisions, sessions, workflows
from tasks.client import AgentClient
from tests.lifecycle.scan import keys_naming, rows_naming
from tests.lifecycle.test_erase import cli
from tests.support import uid

pytestmark = pytest.mark.workers
HOUR = 1 / 24  # a retention setting in days


def age(engine: Engine, session_ids: list[str], workflow_ids: list[str], hours: float) -> None:
    """Make these sessions, their events and revisions, and these workflows and their
    approvals ``hours`` old."""
    then = utcnow() - timedelta(hours=hours)
    with engine.begin() as conn:
        conn.execute(
            update(sessions).where(sessions.c.session_id.in_(session_ids)).values(updated_at=then)
        )
        for table in (events, revisions):
            conn.execute(update(table).where(table.c.session_id.in_(session_ids)).values(at=then))
        conn.execute(
            update(workflows)
            .where(workflows.c.workflow_id.in_(workflow_ids))
            .values(finished_at=then)
        )
        conn.execute(
            update(approvals)
            .where(approvals.c.workflow_id.in_(workflow_ids))
            .values(decided_at=then)
        )


def due_left(engine: Engine, cutoff: Any) -> dict[str, int]:
    with engine.connect() as conn:

        def count(query: Any) -> int:
            return int(conn.execute(query).scalar_one())

        return {
            "sessions": count(
                select(func.count())
                .select_from(sessions)
                .where(sessions.c.phase.in_(DELETABLE_PHASES), sessions.c.updated_at < cutoff)
            ),
            "workflows": count(
                select(func.count()).select_from(workflows).where(workflows.c.finished_at < cutoff)
            ),
            "approvals": count(
                select(func.count()).select_from(approvals).where(approvals.c.decided_at < cutoff)
            ),
            "events": count(select(func.count()).select_from(events).where(events.c.at < cutoff)),
        }


def test_one_prune_deletes_all_that_is_due_and_keeps_a_fresh_session_whole(
    client: AgentClient, settings: Settings
) -> None:
    user = uid("u")
    old = [uid("old") for _ in range(5)]
    fresh = uid("fresh")
    for session_id in [*old, fresh]:
        client.send_message(session_id, "what is 6*7?", user_id=user)
    flows = [
        client.start_workflow(
            {
                "session_id": fresh,
                "steps": [{"step_id": "gate", "action": "echo", "inputs": {}, "approval": True}],
            }
        )
        for _ in range(3)
    ]
    for approval in client.approvals(user_id=user):
        client.decide(approval["approval_id"], True, by="tester")
    for workflow_id in flows:
        client.wait_for_workflow(workflow_id, timeout=60)
    for session_id in [*old, fresh]:
        client.wait_for_idle(session_id, timeout=60)
    before = client.get_session(fresh)
    engine = client.backend.engine
    age(engine, old, flows, hours=2)

    env = {
        "AGENTSTATE_SESSIONS_RETAIN_DAYS": str(HOUR),
        "AGENTSTATE_WORKFLOWS_RETAIN_DAYS": str(HOUR),
        "AGENTSTATE_EVENTS_RETAIN_DAYS": str(HOUR),
    }
    done = cli(settings, "prune", "--json", env=env)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts["sessions"] >= len(old) and counts["workflows"] >= len(flows), counts
    assert counts["steps"] >= len(flows) and counts["approvals"] >= len(flows), counts
    assert counts["messages"] >= 2 * len(old) and counts["events"] > 0, counts
    assert due_left(engine, utcnow() - timedelta(hours=1)) == {
        "sessions": 0,
        "workflows": 0,
        "approvals": 0,
        "events": 0,
    }
    assert rows_naming(engine, old) == {}
    # The fresh session's own log still tells that its workflows ran; nothing else does.
    told = rows_naming(engine, flows)
    assert set(told) <= {"events"} and all(
        row.startswith(f"({fresh},") for row in told.get("events", [])
    ), told
    assert keys_naming(client.backend.redis, [*old, *flows]) == {}
    assert client.get_session(fresh) == before
    assert before is not None
    assert [r["revision"] for r in client.revisions(fresh)][-1] == before["revision"]
    human = cli(settings, "prune", env=env)
    assert human.returncode == 0 and "pruned" in human.stdout, human.stderr


def test_a_run_goes_on_batch_after_batch_until_nothing_is_due(
    client: AgentClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SESSION_BATCH", "WORKFLOW_BATCH", "EVENT_BATCH"):
        monkeypatch.setattr(retention, name, 2)
    user = uid("u")
    old = [uid("old") for _ in range(5)]
    for session_id in old:
        client.send_message(session_id, "what is 1+2?", user_id=user)
    flows = [
        client.start_workflow({"steps": [{"step_id": "a", "action": "echo", "inputs": {}}]})
        for _ in range(5)
    ]
    for session_id in old:
        client.wait_for_idle(session_id, timeout=60)
    for workflow_id in flows:
        client.wait_for_workflow(workflow_id, timeout=60)
    age(client.backend.engine, old, flows, hours=2)
    aged = settings.model_copy(update={"sessions_retain_days": HOUR, "workflows_retain_days": HOUR})
    counts = retention.prune_all(client.backend.engine, client.backend.redis, aged)
    assert counts["sessions"] >= len(old) and counts["workflows"] >= len(flows), counts
    assert rows_naming(client.backend.engine, [*old, *flows]) == {}
