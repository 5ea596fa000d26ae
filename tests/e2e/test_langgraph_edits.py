"""``/lg`` edits to a thread, driven by the official, pinned ``langgraph-sdk`` against a
real ``agentstate serve`` and real workers: ``threads.update_state`` appends messages as
a new checkpoint, and ``runs.cancel(action="rollback")`` removes the running turn as the
double-texting rollback does."""

from __future__ import annotations

import time

import httpx
import pytest
from langgraph_sdk.client import SyncLangGraphClient
from sqlalchemy import create_engine

from config import Settings
from tasks.integrations.langgraph_saver import AgentstateSaver
from tests.e2e import test_langgraph_protocol as base

pytestmark = pytest.mark.workers
# The protocol suite's server, workers and client (module fixtures: one of each here).
lg_settings, api, alice = base.lg_settings, base.api, base.alice
busy_thread, last = base.busy_thread, base.last


def say(text: str) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": text}]}


def test_update_state_appends_messages_as_a_new_checkpoint(alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    alice.runs.wait(tid, "default", input=say("what is 2+2?"))
    before = alice.threads.get_state(tid)
    added = [
        {"type": "human", "content": "from the side", "id": "side-1"},
        {"type": "ai", "content": "noted", "id": "side-2"},
    ]
    made = alice.threads.update_state(tid, {"messages": added})
    checkpoint_id = made["checkpoint"]["checkpoint_id"]
    assert int(checkpoint_id) > int(before["checkpoint"]["checkpoint_id"])
    state = alice.threads.get_state(tid)
    assert state["checkpoint"]["checkpoint_id"] == checkpoint_id
    tail = [(m["type"], m["content"], m["id"]) for m in state["values"]["messages"][-2:]]
    assert tail == [("human", "from the side", "side-1"), ("ai", "noted", "side-2")]
    assert len(state["values"]["messages"]) == len(before["values"]["messages"]) + 2
    history = alice.threads.get_history(tid, limit=5)
    assert history[0]["checkpoint"]["checkpoint_id"] == checkpoint_id
    # The older checkpoint still reads as it was; the appended messages are no run.
    old = alice.threads.get_state(tid, checkpoint_id=before["checkpoint"]["checkpoint_id"])
    assert old["values"] == before["values"]
    assert len(alice.runs.list(tid)) == 1
    after = alice.runs.wait(tid, "default", input=say("what is 12*7?"))
    assert "84" in last(after)["content"]
    graph = alice.threads.create()["thread_id"]
    alice.runs.wait(graph, "echo", input=say("hi"))
    with pytest.raises(httpx.HTTPStatusError) as refused:
        alice.threads.update_state(graph, {"messages": added})
    assert refused.value.response.status_code == 422


def test_update_state_refuses_as_node_and_a_busy_thread_changing_nothing(
    alice: SyncLangGraphClient,
) -> None:
    tid = alice.threads.create()["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        alice.threads.update_state(
            tid, {"messages": [{"type": "human", "content": "x"}]}, as_node="agent"
        )
    assert refused.value.response.status_code == 422
    assert "as_node" in refused.value.response.json()["detail"]
    with pytest.raises(httpx.HTTPStatusError) as malformed:
        alice.threads.update_state(tid, {"messages": [{"type": "tool", "content": "x"}]})
    assert malformed.value.response.status_code == 422
    assert alice.threads.get(tid)["values"] == {"messages": []}
    # A graph's thread (busy here): its state is its graph's checkpoints, refused.
    busy, run_id = busy_thread(alice)
    with pytest.raises(httpx.HTTPStatusError) as graph:
        alice.threads.update_state(busy, {"messages": [{"type": "human", "content": "x"}]})
    assert graph.value.response.status_code == 422
    result = alice.runs.join(busy, run_id)
    assert [m["type"] for m in result["messages"]] == ["human", "ai"]


def test_cancel_with_rollback_removes_the_running_turn(
    alice: SyncLangGraphClient,
    lg_settings: Settings,
) -> None:
    tid = alice.threads.create()["thread_id"]
    alice.runs.wait(tid, "steps", input=say("kept"))
    kept = alice.threads.get_state(tid)["values"]
    busy = alice.runs.create(tid, "steps", input=say("linger a bit"))
    deadline = time.monotonic() + 30
    while alice.threads.get(tid)["status"] != "busy" and time.monotonic() < deadline:
        time.sleep(0.05)  # the run starts: a turn to roll back
    alice.runs.cancel(tid, busy["run_id"], action="rollback")
    assert alice.threads.get(tid)["status"] == "idle"
    assert alice.threads.get_state(tid)["values"] == kept  # as if never sent
    with pytest.raises(httpx.HTTPStatusError) as gone:
        alice.runs.get(tid, busy["run_id"])
    assert gone.value.response.status_code == 404
    assert len(alice.runs.list(tid)) == 1
    after = alice.runs.wait(tid, "steps", input=say("next"))
    assert last(after)["content"] == "all steps done for next"
    # The graph's own state lost the rolled-back turn too (its checkpoints went, and its
    # worker, still running, wrote no more): the graph saw two messages from the user.
    engine = create_engine(lg_settings.database_url)
    try:
        saved = AgentstateSaver(engine).get_tuple({"configurable": {"thread_id": tid}})
    finally:
        engine.dispose()
    assert saved is not None
    humans = [m.content for m in saved.checkpoint["channel_values"]["messages"]]
    assert [h for h in humans if h in ("kept", "linger a bit", "next")] == ["kept", "next"]
    with pytest.raises(httpx.HTTPStatusError) as bad:
        alice.runs.cancel(tid, busy["run_id"], action="explode")  # type: ignore[arg-type]
    assert bad.value.response.status_code in (404, 422)
