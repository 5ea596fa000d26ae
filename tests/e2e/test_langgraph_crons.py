"""``/lg`` crons on agentstate's schedules, driven by the official, pinned
``langgraph-sdk`` against a real ``agentstate serve`` and real workers: a cron of a
thread, a cron with a thread of its own, search and delete scoped by the key's user, a
tick that runs (the schedule clock fired at the tick's time), bad input refused with
nothing stored."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import SyncLangGraphClient
from sqlalchemy import update

from config import Settings
from state.machine import Phase
from state.schedules.ticks import ScheduleClock, TickRules
from state.storage.tables_automation import schedules
from tasks.client import AgentClient
from tasks.server.protocols.langgraph.shapes import assistant_id
from tests.api_support import Api
from tests.e2e import test_langgraph_protocol as base

pytestmark = pytest.mark.workers
# The protocol suite's server, workers and client (module fixtures: one of each here).
lg_settings, api, alice = base.lg_settings, base.api, base.alice
last, sdk = base.last, base.sdk


def say(text: str) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": text}]}


def fire(settings: Settings, cron_id: str, thread_id: str) -> None:
    """The schedule clock at the cron's next tick, and the turn it starts on ``thread_id``
    kicked. (Other modules' schedules in this database may be due by then too: they fire
    as well, and only this thread's turn is kicked.)"""
    client = AgentClient(settings)
    at = datetime.now(UTC) + timedelta(days=400)  # due now, whatever the cron says
    with client.backend.engine.begin() as conn:
        conn.execute(
            update(schedules).where(schedules.c.schedule_id == cron_id).values(next_tick=at)
        )
    clock = ScheduleClock(client.backend.engine, TickRules.from_settings(settings))
    report = clock.fire_due(at + timedelta(seconds=1))
    kicks = [
        (session_id, revision) for session_id, revision in report.kicks if session_id == thread_id
    ]
    assert report.fired >= 1 and len(kicks) == 1, report
    for session_id, revision in kicks:
        client.dispatcher.phase(Phase.UNDERSTANDING, session_id, revision)


def ran(client: SyncLangGraphClient, tid: str, runs: int) -> dict[str, Any]:
    """The thread's last message once its ``runs``-th run has ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = client.runs.list(tid)
        if len(found) == runs and found[0]["status"] == "success":
            break
        time.sleep(0.1)  # the tick's run waits its turn, then runs
    return last(client.threads.get_state(tid)["values"])


def test_a_threads_cron_runs_its_input_on_that_thread(
    api: Api, alice: SyncLangGraphClient, lg_settings: Settings
) -> None:
    tid = alice.threads.create()["thread_id"]
    alice.runs.wait(tid, "echo", input=say("first"))
    made = alice.crons.create_for_thread(
        tid, "echo", schedule="0 9 * * *", input=say("tick"), timezone="Europe/Paris",
        metadata={"k": "v"},
    )  # fmt: skip
    assert made["thread_id"] == tid and made["schedule"] == "0 9 * * *"
    assert made["assistant_id"] == assistant_id("echo") and made["enabled"] is True
    assert made["timezone"] == "Europe/Paris" and made["next_run_date"]
    found = alice.crons.search(thread_id=tid)
    assert [c["cron_id"] for c in found] == [made["cron_id"]]
    assert alice.crons.search(metadata={"k": "v"})[0]["cron_id"] == made["cron_id"]
    bob = sdk(api, "bob")
    assert bob.crons.search(thread_id=tid) == []
    with pytest.raises(httpx.HTTPStatusError) as theirs:
        bob.crons.delete(made["cron_id"])
    assert theirs.value.response.status_code == 404
    fire(lg_settings, made["cron_id"], tid)
    assert ran(alice, tid, 2)["content"] == "echo: tick (#2)"
    alice.crons.delete(made["cron_id"])
    assert alice.crons.search(thread_id=tid) == []


def test_a_cron_without_a_thread_runs_on_one_of_its_own(
    alice: SyncLangGraphClient, lg_settings: Settings
) -> None:
    made = alice.crons.create("echo", schedule="*/5 * * * *", input=say("alone"))
    tid = made["thread_id"]
    assert alice.threads.get(tid)["values"] == {"messages": []}
    fire(lg_settings, made["cron_id"], tid)
    assert ran(alice, tid, 1)["content"] == "echo: alone (#1)"
    alice.crons.delete(made["cron_id"])


def test_a_bad_cron_is_refused_naming_the_field_and_stores_nothing(
    alice: SyncLangGraphClient,
) -> None:
    tid = alice.threads.create()["thread_id"]
    alice.runs.wait(tid, "echo", input=say("mine"))
    with pytest.raises(httpx.HTTPStatusError) as other:
        alice.crons.create_for_thread(tid, "steps", schedule="0 9 * * *", input=say("x"))
    assert "assistant_id" in other.value.response.json()["detail"]
    before = len(alice.crons.search(limit=100))
    for kwargs, field in [
        ({"schedule": "not a cron"}, "schedule"),
        ({"schedule": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"schedule": "0 9 * * *", "webhook": "https://example.com/h"}, "webhook"),
        ({"schedule": "0 9 * * *", "multitask_strategy": "rollback"}, "multitask_strategy"),
    ]:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            alice.crons.create_for_thread(tid, "echo", input=say("x"), **kwargs)  # type: ignore[arg-type]
        assert refused.value.response.status_code == 422
        assert field in refused.value.response.json()["detail"]
    with pytest.raises(httpx.HTTPStatusError) as stateless:
        alice.crons.create("echo", schedule="not a cron", input=say("x"))
    assert stateless.value.response.status_code == 422
    with pytest.raises(httpx.HTTPStatusError) as deleting:
        alice.crons.create("echo", schedule="0 9 * * *", input=say("x"), on_run_completed="delete")
    assert "on_run_completed" in deleting.value.response.json()["detail"]
    assert len(alice.crons.search(limit=100)) == before
    with pytest.raises(httpx.HTTPStatusError) as missing:
        alice.crons.delete("no-such-cron")
    assert missing.value.response.status_code == 404
