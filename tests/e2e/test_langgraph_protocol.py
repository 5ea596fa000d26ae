"""LangGraph's Agent Server protocol at ``/lg``, driven by the official, pinned
``langgraph-sdk`` Python client against a real ``agentstate serve`` (uvicorn) and real
workers: assistants, threads, runs (wait, create, stream, get, list, join, cancel), an
interrupt resumed with ``Command(resume=...)``, state and history, double texting
rejected, keys (``x-api-key``), another user's thread, and fields the server does not
honour refused with 422."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from config import Settings
from tasks.server.protocols.langgraph.shapes import assistant_id
from tests.api_support import Api, new_keys, serving
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers

AGENTS = "echo=tests.graphs:echo,approve=tests.graphs:approve,steps=tests.graphs:steps"


@pytest.fixture(scope="module")
def lg_settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url, agents=AGENTS)


@pytest.fixture(scope="module")
def api(lg_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    log_dir = tmp_path_factory.mktemp("lg-protocol")
    workers = Workers(lg_settings, log_dir, count=1).start()
    try:
        with serving(lg_settings, log_dir, new_keys("alice", "bob", "*")) as running:
            yield running
    finally:
        workers.stop()


def sdk(api: Api, user: str) -> SyncLangGraphClient:
    return get_sync_client(url=f"{api.url}/lg", api_key=api.keys[user], timeout=120)


@pytest.fixture(scope="module")
def alice(api: Api) -> SyncLangGraphClient:
    return sdk(api, "alice")


def last(values: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = values["messages"][-1]
    return message


def test_ok_info_and_assistants(api: Api, alice: SyncLangGraphClient) -> None:
    assert httpx.get(f"{api.url}/lg/ok", headers={"x-api-key": api.keys["alice"]}).json() == {
        "ok": True
    }
    found = alice.assistants.search(limit=10)
    assert [a["graph_id"] for a in found] == ["default", "echo", "approve", "steps"]
    echo = alice.assistants.get(assistant_id("echo"))
    assert echo["graph_id"] == "echo" and echo["assistant_id"] == assistant_id("echo")
    assert alice.assistants.get("echo")["assistant_id"] == assistant_id("echo")
    with pytest.raises(httpx.HTTPStatusError) as missing:
        alice.assistants.get("nobody")
    assert missing.value.response.status_code == 404
    assert "detail" in missing.value.response.json()


def test_keys_are_required_and_threads_are_their_users(
    api: Api, alice: SyncLangGraphClient
) -> None:
    answer = httpx.post(f"{api.url}/lg/threads", json={})
    assert answer.status_code == 401 and "detail" in answer.json()
    bearer = {"Authorization": f"Bearer {api.keys['alice']}"}
    assert httpx.get(f"{api.url}/lg/info", headers=bearer).status_code == 200
    thread = alice.threads.create(metadata={"topic": "mine"})
    bob = sdk(api, "bob")
    with pytest.raises(httpx.HTTPStatusError) as theirs:
        bob.threads.get(thread["thread_id"])
    assert theirs.value.response.status_code == 404
    assert [t["thread_id"] for t in bob.threads.search(metadata={"topic": "mine"})] == []
    mine = alice.threads.search(metadata={"topic": "mine"})
    assert thread["thread_id"] in [t["thread_id"] for t in mine]


def test_a_thread_is_created_once_read_and_deleted(alice: SyncLangGraphClient) -> None:
    thread_id = uid("t")
    made = alice.threads.create(thread_id=thread_id, metadata={"k": 1})
    assert made["thread_id"] == thread_id and made["status"] == "idle"
    assert made["metadata"] == {"k": 1} and made["values"] == {"messages": []}
    with pytest.raises(httpx.HTTPStatusError) as taken:
        alice.threads.create(thread_id=thread_id)
    assert taken.value.response.status_code == 409
    assert alice.threads.create(thread_id=thread_id, if_exists="do_nothing")["metadata"] == {"k": 1}
    alice.threads.delete(thread_id)
    with pytest.raises(httpx.HTTPStatusError) as gone:
        alice.threads.get(thread_id)
    assert gone.value.response.status_code == 404


def test_runs_wait_on_a_graph_and_on_the_default_agent(alice: SyncLangGraphClient) -> None:
    thread = alice.threads.create()
    tid = thread["thread_id"]
    result = alice.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "hi"}]})
    assert last(result)["type"] == "ai" and last(result)["content"] == "echo: hi (#1)"
    again = alice.runs.wait(
        tid, assistant_id("echo"), input={"messages": [{"type": "human", "content": "yo"}]}
    )
    assert last(again)["content"] == "echo: yo (#2)"
    runs = alice.runs.list(tid)
    assert len(runs) == 2 and all(r["status"] == "success" for r in runs)
    assert alice.runs.get(tid, runs[0]["run_id"])["status"] == "success"
    assert alice.runs.join(tid, runs[0]["run_id"])["messages"][-1]["content"] == "echo: yo (#2)"
    state = alice.threads.get_state(tid)
    assert state["next"] == [] and len(state["values"]["messages"]) == 4
    history = alice.threads.get_history(tid, limit=5)
    assert history and history[0]["values"]["messages"] == state["values"]["messages"]
    # The default agent answers a thread of its own.
    plain = alice.threads.create()["thread_id"]
    answer = alice.runs.wait(
        plain, "default", input={"messages": [{"role": "user", "content": "what is 12*7?"}]}
    )
    assert "84" in last(answer)["content"]


def test_an_interrupt_waits_and_command_resume_decides_it(alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    asked = alice.runs.wait(
        tid, "approve", input={"messages": [{"role": "user", "content": "pay"}]}
    )
    assert asked["__interrupt__"][0]["value"] == {"amount": 5}
    assert alice.threads.get(tid)["status"] == "interrupted"
    assert alice.threads.get_state(tid)["tasks"][0]["interrupts"][0]["value"] == {"amount": 5}
    done = alice.runs.wait(tid, "approve", command={"resume": {"approved": True, "note": "fine"}})
    assert last(done)["content"] == "transfer approved (fine)"
    assert alice.threads.get(tid)["status"] == "idle"


def test_a_stream_starts_with_metadata_and_its_chunks_make_the_reply(
    alice: SyncLangGraphClient,
) -> None:
    tid = alice.threads.create()["thread_id"]
    parts = list(
        alice.runs.stream(
            tid,
            "echo",
            input={"messages": [{"role": "user", "content": "flow"}]},
            stream_mode=["messages-tuple", "values"],
        )
    )
    assert parts[0].event == "metadata" and "run_id" in parts[0].data
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    assert chunks and len({c["id"] for c in chunks}) == 1
    final = [p.data for p in parts if p.event == "values"][-1]
    assert last(final)["content"] == "echo: flow (#1)"
    assert last(final)["id"] == chunks[0]["id"]
    assert "echo: flow (#1)" in "".join(c["content"] for c in chunks)


def test_a_busy_thread_rejects_a_double_text(alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    slow = {"messages": [{"role": "user", "content": "linger a bit"}]}
    run = alice.runs.create(tid, "steps", input=slow)
    assert run["status"] == "pending"
    deadline = time.monotonic() + 30
    while alice.threads.get(tid)["status"] != "busy" and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(httpx.HTTPStatusError) as busy:
        alice.runs.wait(tid, "steps", input={"messages": [{"role": "user", "content": "x"}]})
    assert busy.value.response.status_code == 409
    assert "Thread is already running a task" in busy.value.response.json()["detail"]
    result = alice.runs.join(tid, run["run_id"])
    assert last(result)["content"] == "all steps done for linger a bit"


def test_fields_the_server_does_not_honour_are_refused_naming_them(
    alice: SyncLangGraphClient,
) -> None:
    tid = alice.threads.create()["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as refused:
        alice.runs.wait(
            tid, "echo", input={"messages": [{"role": "user", "content": "x"}]},
            webhook="https://example.com/hook",
        )  # fmt: skip
    assert refused.value.response.status_code == 422
    assert "webhook" in refused.value.response.json()["detail"]
    assert alice.threads.get(tid)["values"] == {"messages": []}  # nothing was sent


def busy_thread(client: SyncLangGraphClient) -> tuple[str, str]:
    """A thread whose run (the slow graph) is under way, and that run's id."""
    tid = client.threads.create()["thread_id"]
    slow = {"messages": [{"role": "user", "content": "linger a bit"}]}
    run = client.runs.create(tid, "steps", input=slow)
    deadline = time.monotonic() + 30
    while client.threads.get(tid)["status"] != "busy" and time.monotonic() < deadline:
        time.sleep(0.05)
    return tid, run["run_id"]


@pytest.mark.parametrize(
    ("strategy", "first"), [("enqueue", "success"), ("interrupt", "interrupted")]
)
def test_enqueue_waits_its_turn_and_interrupt_cancels_the_running_one(
    alice: SyncLangGraphClient, strategy: str, first: str
) -> None:
    tid, run_id = busy_thread(alice)
    after = alice.runs.wait(
        tid, "steps", input={"messages": [{"role": "user", "content": "then this"}]},
        multitask_strategy=strategy,
    )  # fmt: skip
    assert last(after)["content"] == "all steps done for then this"
    assert alice.runs.get(tid, run_id)["status"] == first
    assert [r["status"] for r in alice.runs.list(tid)] == ["success", first]


def test_another_users_thread_cannot_be_run(api: Api, alice: SyncLangGraphClient) -> None:
    tid = alice.threads.create()["thread_id"]
    bob = sdk(api, "bob")
    with pytest.raises(httpx.HTTPStatusError) as theirs:
        bob.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "x"}]})
    assert theirs.value.response.status_code == 404
    assert alice.threads.get(tid)["values"] == {"messages": []}


def test_join_stream_follows_a_run_under_way_and_replays_a_finished_one(
    alice: SyncLangGraphClient,
) -> None:
    tid, run_id = busy_thread(alice)
    parts = list(alice.runs.join_stream(tid, run_id, stream_mode="values"))
    assert parts[0].event == "metadata" and parts[0].data["run_id"] == run_id
    assert last(parts[-1].data)["content"] == "all steps done for linger a bit"
    again = list(alice.runs.join_stream(tid, run_id))
    assert [p.event for p in again] == ["metadata", "values"]
    assert again[-1].data == parts[-1].data
    with pytest.raises(httpx.HTTPStatusError) as refused:
        list(alice.runs.join_stream(tid, run_id, last_event_id="seven"))
    assert refused.value.response.status_code == 422
