"""``/lg`` streams resumed from the event log, driven by the official, pinned
``langgraph-sdk`` against a real ``agentstate serve`` and real workers: every frame but
the first carries an id, ``join_stream(..., last_event_id=...)`` goes on after it (each
frame shown once), ``stream_resumable`` is accepted, ``on_disconnect="cancel"`` cancels a
run whose streaming client went away, and what is not served is refused naming it."""

from __future__ import annotations

import time

import httpx
import pytest
from langgraph_sdk.client import SyncLangGraphClient

from tests.e2e import test_langgraph_protocol as base

pytestmark = pytest.mark.workers
# The protocol suite's server, workers and client (module fixtures: one of each here).
lg_settings, api, alice = base.lg_settings, base.api, base.alice
busy_thread, last = base.busy_thread, base.last
MODES = ["messages-tuple", "values"]


def say(text: str) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": text}]}


def test_a_finished_runs_stream_resumes_after_any_frame(alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    parts = list(
        alice.runs.stream(tid, "echo", input=say("ids"), stream_mode=MODES, stream_resumable=True)
    )
    assert parts[0].event == "metadata"
    assert all(p.id for p in parts[1:]) and len({p.id for p in parts[1:]}) == len(parts) - 1
    run_id = parts[0].data["run_id"]
    chunk = next(p for p in parts if p.event == "messages")
    rest = list(alice.runs.join_stream(tid, run_id, stream_mode=MODES, last_event_id=chunk.id))
    assert [p.event for p in rest] == ["metadata", "values"]
    assert rest[-1].data == parts[-1].data and rest[-1].id == parts[-1].id
    after_end = list(alice.runs.join_stream(tid, run_id, last_event_id=parts[-1].id))
    assert [p.event for p in after_end] == ["metadata"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        list(alice.runs.join_stream(tid, run_id, last_event_id="not-an-id"))
    assert refused.value.response.status_code == 422


def test_a_run_under_way_is_joined_again_after_a_break_each_frame_once(
    alice: SyncLangGraphClient,
) -> None:
    tid, run_id = busy_thread(alice)
    first = []
    for part in alice.runs.join_stream(tid, run_id, stream_mode=MODES):
        first.append(part)
        if part.id:
            break  # the connection drops here
    rest = list(alice.runs.join_stream(tid, run_id, stream_mode=MODES, last_event_id=first[-1].id))
    parts = [p for p in first + rest if p.event != "metadata"]
    assert parts[-1].event == "values"
    assert last(parts[-1].data)["content"] == "all steps done for linger a bit"
    ids = [p.id for p in parts]
    assert len(ids) == len(set(ids))  # nothing shown twice


def test_on_disconnect_cancel_cancels_the_run_when_its_client_goes(
    alice: SyncLangGraphClient,
) -> None:
    tid = alice.threads.create()["thread_id"]
    stream = alice.runs.stream(tid, "steps", input=say("linger a bit"), on_disconnect="cancel")
    first = next(iter(stream))
    run_id = first.data["run_id"]
    stream.close()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    status = None
    while status != "interrupted" and time.monotonic() < deadline:
        time.sleep(0.1)
        found = [r["status"] for r in alice.runs.list(tid) if r["run_id"] == run_id]
        status = found[0] if found else None  # None: still waiting its turn
    assert status == "interrupted"
    # The default, "continue": the run goes on without its client.
    kept = alice.threads.create()["thread_id"]
    stream = alice.runs.stream(kept, "steps", input=say("linger a bit"))
    run_id = next(iter(stream)).data["run_id"]
    stream.close()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while alice.threads.get(kept)["status"] != "busy" and time.monotonic() < deadline:
        time.sleep(0.05)  # its turn starts (a run waiting in the inbox is not joined)
    assert last(alice.runs.join(kept, run_id))["content"] == "all steps done for linger a bit"


def test_what_is_not_served_is_refused_naming_it(alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        alice.runs.wait(tid, "echo", input=say("x"), on_disconnect="cancel")
    assert refused.value.response.status_code == 422
    assert "on_disconnect" in refused.value.response.json()["detail"]
    with pytest.raises(httpx.HTTPStatusError) as bad:
        list(alice.runs.stream(tid, "echo", input=say("x"), on_disconnect="explode"))  # type: ignore[arg-type]
    assert bad.value.response.status_code == 422
    assert alice.threads.get(tid)["values"] == {"messages": []}
