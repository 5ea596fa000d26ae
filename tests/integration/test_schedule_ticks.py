"""Schedules in-process on each backend, with a fixed clock: a tick fires once (its guarded
row), catch_up and overlap, workflows per tick, a target that refuses, bad input that stores
nothing, another user's schedule that reads as unknown."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from config import Settings
from state.errors import BadInputError, NotFoundError, SessionOwnershipError
from state.lifecycle.retention import prune_all
from state.schedules.ticks import STILL_GOING, ScheduleClock, TickRules
from state.storage.db import read_connection
from state.storage.tables import inbox
from state.storage.tables_automation import schedule_runs, schedules
from tasks.client import AgentClient
from tests.support import make_settings, uid

T0 = datetime(2026, 12, 4, 9, 0, 0, tzinfo=UTC)


@pytest.fixture
def client(settings: Settings) -> AgentClient:
    made = AgentClient(
        make_settings(settings.database_url, action_modules="tests.actions_for_tests")
    )
    # The clock is fixed and the database shared by the module: no schedule of an earlier
    # test may be due at this test's times.
    with made.backend.engine.begin() as conn:
        conn.execute(delete(schedules))
    return made


def clock(client: AgentClient, **rules: Any) -> ScheduleClock:
    base = TickRules.from_settings(client.settings)
    return ScheduleClock(client.backend.engine, replace(base, **rules))


def due_now(client: AgentClient, schedule_id: str, at: datetime) -> None:
    """Put the schedule's next tick at ``at`` (what creating it ``at`` minus a bit does)."""
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(schedules).where(schedules.c.schedule_id == schedule_id).values(next_tick=at)
        )


def runs_of(client: AgentClient, schedule_id: str) -> list[dict[str, Any]]:
    return client.schedule_runs(schedule_id)


def test_a_tick_fires_once_and_the_next_one_is_moved_on(client: AgentClient) -> None:
    user, session = uid("u"), uid("s")
    sid = uid("sch")
    made = client.create_schedule(
        sid, every_seconds=60, user_id=user, session_id=session, text="hello"
    )
    assert made["next_tick"] is not None and made["paused"] is False
    due_now(client, sid, T0)
    first = clock(client).fire_due(T0 + timedelta(seconds=1))
    assert (first.fired, first.skipped, first.missed) == (1, 0, 0)
    assert first.kicks == [(session, 0)] or first.kicks[0][0] == session
    again = clock(client).fire_due(T0 + timedelta(seconds=1))
    assert (again.fired, again.skipped) == (0, 0)
    runs = runs_of(client, sid)
    assert [(r["tick"], r["status"]) for r in runs] == [("2026-12-04T09:00:00Z", "fired")]
    assert client.get_schedule(sid)["next_tick"] == "2026-12-04T09:01:00Z"  # type: ignore[index]
    with read_connection(client.backend.engine) as conn:
        queued = conn.execute(
            select(inbox.c.message_id, inbox.c.text).where(inbox.c.session_id == session)
        ).all()
    assert [(m, t) for m, t in queued] == [(runs[0]["message_id"], "hello")]


def test_a_tick_with_a_row_never_fires_again(client: AgentClient) -> None:
    """The guarded row: put next_tick back on a tick that fired (a beat that read the old
    row before the commit); it is moved on and nothing fires twice."""
    user, session, sid = uid("u"), uid("s"), uid("sch")
    client.create_schedule(sid, every_seconds=60, user_id=user, session_id=session, text="hi")
    due_now(client, sid, T0)
    assert clock(client).fire_due(T0).fired == 1
    due_now(client, sid, T0)
    report = clock(client).fire_due(T0)
    assert (report.fired, report.skipped) == (0, 0)
    assert len(runs_of(client, sid)) == 1
    with read_connection(client.backend.engine) as conn:
        count = conn.execute(
            select(func.count()).select_from(inbox).where(inbox.c.session_id == session)
        ).scalar()
    assert count == 1


def test_catch_up_latest_fires_the_most_recent_missed_tick_once(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    client.create_schedule(
        sid, "*/5 * * * *", user_id=user, session_id=uid("s"), text="x", overlap="enqueue"
    )
    due_now(client, sid, T0)
    report = clock(client).fire_due(T0 + timedelta(hours=2, minutes=3))  # an outage
    assert report.fired == 1
    assert [r["tick"] for r in runs_of(client, sid)] == ["2026-12-04T11:00:00Z"]
    assert client.get_schedule(sid)["next_tick"] == "2026-12-04T11:05:00Z"  # type: ignore[index]


def test_ticks_late_within_the_grace_all_fire(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    client.create_schedule(
        sid, every_seconds=10, user_id=user, session_id=uid("s"), text="x", overlap="enqueue"
    )
    due_now(client, sid, T0)
    report = clock(client, grace_s=60.0).fire_due(T0 + timedelta(seconds=35))
    assert (report.fired, report.missed) == (4, 0)
    assert [r["tick"][-3:] for r in runs_of(client, sid)] == ["30Z", "20Z", "10Z", "00Z"]


def test_catch_up_none_lets_missed_ticks_go(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    client.create_schedule(
        sid, "*/5 * * * *", user_id=user, session_id=uid("s"), text="x", catch_up="none"
    )
    due_now(client, sid, T0)
    report = clock(client, grace_s=60.0).fire_due(T0 + timedelta(hours=2, minutes=3))
    assert (report.fired, report.missed) == (0, 1)
    assert runs_of(client, sid) == []
    assert client.get_schedule(sid)["next_tick"] == "2026-12-04T11:05:00Z"  # type: ignore[index]
    # On time (within the grace), it fires.
    due_now(client, sid, T0)
    assert clock(client, grace_s=60.0).fire_due(T0 + timedelta(seconds=30)).fired == 1


def test_overlap_skip_records_a_tick_whose_run_still_goes(client: AgentClient) -> None:
    user, session = uid("u"), uid("s")
    skip, enqueue = uid("skip"), uid("enq")
    client.create_schedule(skip, every_seconds=60, user_id=user, session_id=session, text="a")
    client.create_schedule(
        enqueue, every_seconds=60, user_id=user, session_id=uid("s"), text="b", overlap="enqueue"
    )
    for sid in (skip, enqueue):
        due_now(client, sid, T0)
    clock(client).fire_due(T0)
    for sid in (skip, enqueue):
        due_now(client, sid, T0 + timedelta(minutes=1))
    clock(client).fire_due(T0 + timedelta(minutes=1))  # no worker answered the first message
    skipped = runs_of(client, skip)
    assert [(r["status"], r.get("reason")) for r in skipped] == [
        ("skipped", STILL_GOING),
        ("fired", None),
    ]
    assert [r["status"] for r in runs_of(client, enqueue)] == ["fired", "fired"]


def test_a_workflow_per_tick_named_by_schedule_and_tick(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    spec = {"steps": [{"step_id": "a", "action": "echo", "inputs": {"n": 1}}]}
    client.create_schedule(sid, "0 9 * * *", user_id=user, workflow=spec, timezone="Europe/Paris")
    due_now(client, sid, T0)
    report = clock(client).fire_due(T0)
    assert report.fired == 1
    ((wf, roots),) = report.started
    assert wf.workflow_id == f"{sid}:2026-12-04T09:00:00Z"
    assert roots == [("a", 0)]
    assert runs_of(client, sid)[0]["workflow_id"] == wf.workflow_id
    stored = client.get_workflow(wf.workflow_id, user_id=user)
    assert stored is not None and stored["status"] == "running"
    # 09:00 in Paris is 08:00 UTC in winter.
    assert client.get_schedule(sid)["next_tick"] == "2026-12-05T08:00:00Z"  # type: ignore[index]


def test_a_target_that_refuses_skips_the_tick_with_its_reason(client: AgentClient) -> None:
    """A full inbox (AGENTSTATE_MAX_QUEUED_MESSAGES): the tick is recorded skipped, saying
    why, and nothing of it is stored."""
    user, session, sid = uid("u"), uid("s"), uid("sch")
    client.send_message(session, "first", user_id=user)  # nobody answers it: it waits
    client.create_schedule(
        sid, every_seconds=60, user_id=user, session_id=session, text="x", overlap="enqueue"
    )
    due_now(client, sid, T0)
    report = clock(client, max_queued=1).fire_due(T0)
    assert (report.fired, report.skipped) == (0, 1)
    (run,) = runs_of(client, sid)
    assert run["status"] == "skipped" and "AGENTSTATE_MAX_QUEUED_MESSAGES" in run["reason"]
    assert client.inbox.queued_count(session) == 1


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * *"}, "five fields"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"cron": "0 9 * * *", "every_seconds": 60}, "exactly one"),
        ({}, "exactly one"),
        ({"every_seconds": 0.5}, "at least 1"),
        ({"every_seconds": 60, "catch_up": "all"}, "catch_up"),
        ({"every_seconds": 60, "overlap": "queue"}, "overlap"),
        ({"every_seconds": 60, "text": None, "workflow": None}, "exactly one of text"),
        (
            {
                "every_seconds": 60,
                "workflow": {"steps": [{"step_id": "a", "action": "nope"}]},
                "text": None,
            },
            "nope",
        ),
        (
            {"every_seconds": 60, "workflow": {"workflow_id": "w", "steps": []}, "text": None},
            "workflow_id",
        ),
        ({"every_seconds": 60, "session_id": None}, "session_id"),
        ({"every_seconds": 60, "text": "   "}, "empty"),
    ],
)
def test_bad_input_is_refused_with_nothing_stored(
    client: AgentClient, arguments: dict[str, Any], says: str
) -> None:
    user, sid = uid("u"), uid("sch")
    given: dict[str, Any] = {"user_id": user, "session_id": uid("s"), "text": "hello", **arguments}
    with pytest.raises(BadInputError, match=says):
        client.create_schedule(sid, **given)
    assert client.list_schedules(user_id=user) == []
    with read_connection(client.backend.engine) as conn:
        assert (
            conn.execute(
                select(func.count()).select_from(schedules).where(schedules.c.user_id == user)
            ).scalar()
            == 0
        )


def test_another_users_schedule_reads_and_acts_as_unknown(client: AgentClient) -> None:
    owner, stranger, session, sid = uid("u"), uid("u"), uid("s"), uid("sch")
    client.create_schedule(sid, every_seconds=60, user_id=owner, session_id=session, text="x")
    assert client.get_schedule(sid, user_id=stranger) is None
    assert client.list_schedules(user_id=stranger) == []
    for call in (
        client.pause_schedule,
        client.resume_schedule,
        client.delete_schedule,
        client.schedule_runs,
    ):
        with pytest.raises(NotFoundError):
            call(sid, user_id=stranger)  # type: ignore[operator]
    assert client.get_schedule(sid, user_id=owner)["paused"] is False  # type: ignore[index]
    # A schedule may not write to another user's session.
    client.send_message(session, "mine", user_id=owner)
    with pytest.raises(SessionOwnershipError):
        client.create_schedule(
            uid("sch"), every_seconds=60, user_id=stranger, session_id=session, text="x"
        )


def test_pause_resume_delete(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    client.create_schedule(sid, every_seconds=60, user_id=user, session_id=uid("s"), text="x")
    paused = client.pause_schedule(sid, user_id=user)
    assert paused["paused"] is True and paused["next_tick"] is None
    due_now(client, sid, T0)
    assert clock(client).fire_due(T0 + timedelta(hours=1)).fired == 0
    resumed = client.resume_schedule(sid, user_id=user)
    assert resumed["paused"] is False and resumed["next_tick"] is not None
    assert client.delete_schedule(sid, user_id=user) is True
    assert client.get_schedule(sid) is None
    with read_connection(client.backend.engine) as conn:
        left = conn.execute(
            select(func.count())
            .select_from(schedule_runs)
            .where(schedule_runs.c.schedule_id == sid)
        ).scalar()
    assert left == 0
    with pytest.raises(NotFoundError):
        client.delete_schedule(sid)


def test_the_same_create_again_returns_the_schedule_another_is_refused(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    first = client.create_schedule(
        sid, every_seconds=60, user_id=user, session_id=uid("s"), text="x", payload={"k": 1}
    )
    assert (
        client.create_schedule(
            sid,
            every_seconds=60,
            user_id=user,
            session_id=first["session_id"],
            text="x",
            payload={"k": 1},
        )["schedule_id"]
        == sid
    )
    with pytest.raises(BadInputError, match="already exists"):
        client.create_schedule(
            sid, every_seconds=30, user_id=user, session_id=first["session_id"], text="x"
        )
    assert client.get_schedule(sid)["payload"] == {"k": 1}  # type: ignore[index]


def test_retention_prunes_old_ticks_with_the_events(client: AgentClient) -> None:
    user, sid = uid("u"), uid("sch")
    client.create_schedule(sid, every_seconds=60, user_id=user, session_id=uid("s"), text="x")
    due_now(client, sid, T0)
    clock(client).fire_due(T0)
    later = T0 + timedelta(days=client.settings.events_retain_days + 1)
    counts = prune_all(client.backend.engine, client.backend.redis, client.settings, later)
    assert counts["schedule_runs"] >= 1 and "webhook_deliveries" in counts
    assert runs_of(client, sid) == []
    assert client.get_schedule(sid) is not None  # the schedule itself stays
