"""A2A 1.0 (JSON-RPC) on a real ``agentstate serve`` and real workers, driven by the official
``a2a-sdk`` client: the public card, a blocking send, a stream, get, list, cancel, an
approval as ``input-required`` answered on the task, a subscription resumed from the event
log after Redis was flushed, and another user's task reading as missing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from google.protobuf.struct_pb2 import Value

from config import Settings
from tasks.client import AgentClient
from tests.api_support import Api, new_keys, serving
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    """The test agent (the reference agent, plus slow turns on request)."""
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    keys = new_keys("alice", "bob", "*")
    with serving(worker_settings, tmp_path_factory.mktemp("serve"), keys) as running:
        yield running


@pytest.fixture(scope="module")
def agent(worker_settings: Settings) -> AgentClient:
    return AgentClient(worker_settings)


async def connect(api: Api, user: str, streaming: bool = True) -> Any:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {api.keys[user]}"}, timeout=60)
    config = ClientConfig(httpx_client=http, streaming=streaming)
    return await ClientFactory(config).create_from_url(f"{api.url}/a2a/default")


def message(
    text: str | None = None, *, context: str = "", task: str = "", **data: Any
) -> pb.Message:
    parts = [pb.Part(text=text)] if text is not None else []
    if data:
        value = Value()
        value.struct_value.update(data)
        parts.append(pb.Part(data=value))
    return pb.Message(
        message_id=str(uuid.uuid4()),
        role=pb.ROLE_USER,
        parts=parts,
        context_id=context,
        task_id=task,
    )


async def send(client: Any, sent: pb.Message, **config: Any) -> list[pb.StreamResponse]:
    request = pb.SendMessageRequest(message=sent)
    for key, value in config.items():
        setattr(request.configuration, key, value)
    return [event async for event in client.send_message(request)]


def reply_text(task: pb.Task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_card_is_public_and_says_how_to_call(api: Api) -> None:
    anyone = httpx.get(f"{api.url}/.well-known/agent-card.json")
    assert anyone.status_code == 200
    assert httpx.get(f"{api.url}/a2a/nobody/.well-known/agent-card.json").status_code == 404

    async def resolve() -> pb.AgentCard:
        async with httpx.AsyncClient() as http:
            return await A2ACardResolver(http, f"{api.url}/a2a/default").get_agent_card()

    card = run(resolve())
    (interface,) = card.supported_interfaces
    assert interface.url == f"{api.url}/a2a/default" and interface.protocol_binding == "JSONRPC"
    assert interface.protocol_version == "1.0"
    assert card.capabilities.streaming
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "bearer"
    assert httpx.post(f"{api.url}/a2a/default", json={}).status_code == 401


def test_a_blocking_send_returns_the_answered_task(api: Api, agent: AgentClient) -> None:
    async def go() -> tuple[pb.Task, pb.Task, pb.ListTasksResponse]:
        client = await connect(api, "alice", streaming=False)
        (answer,) = await send(client, message("what is 12*7?"))
        task = answer.task
        got = await client.get_task(pb.GetTaskRequest(id=task.id))
        listed = await client.list_tasks(
            pb.ListTasksRequest(context_id=task.context_id, include_artifacts=True)
        )
        working = await client.list_tasks(
            pb.ListTasksRequest(context_id=task.context_id, status=pb.TASK_STATE_WORKING)
        )
        assert list(working.tasks) == []
        streaming = await connect(api, "alice")
        try:
            [_ async for _ in streaming.subscribe(pb.SubscribeToTaskRequest(id=task.id))]
        except A2AError as exc:
            assert "finished task" in str(exc)
        else:
            raise AssertionError("subscribing to a finished task was not refused")
        return task, got, listed

    task, got, listed = run(go())
    assert task.status.state == pb.TASK_STATE_COMPLETED
    assert "84" in reply_text(task)
    assert task.status.message.parts[0].text == reply_text(task)
    stored = agent.get_session(task.context_id)
    assert stored is not None and stored["user_id"] == "alice"
    assert stored["message_history"][-1]["content"] == reply_text(task)
    assert got.id == task.id and got.status.state == pb.TASK_STATE_COMPLETED
    assert [t.id for t in listed.tasks] == [task.id] and reply_text(listed.tasks[0]) == reply_text(
        task
    )


def test_a_stream_shows_the_reply_as_it_is_written(api: Api) -> None:
    async def go() -> list[pb.StreamResponse]:
        client = await connect(api, "alice")
        return await send(client, message("please trickle"))

    events = run(go())
    assert events[0].HasField("task")
    task_id = events[0].task.id
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert len(updates) > 2 and updates[-1].last_chunk and not updates[0].append
    text = "".join(u.artifact.parts[0].text for u in updates)
    assert text == "".join(f"part {n} " for n in range(1, 13))
    statuses = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert statuses[0] == pb.TASK_STATE_WORKING and statuses[-1] == pb.TASK_STATE_COMPLETED
    assert all(e.status_update.task_id == task_id for e in events if e.HasField("status_update"))


def test_an_approval_is_input_required_answered_on_the_task(api: Api, agent: AgentClient) -> None:
    async def go() -> tuple[pb.Task, pb.Task, pb.Task]:
        client = await connect(api, "alice", streaming=False)
        context = uid("ctx")
        await send(client, message("remember that owls hoot", context=context))
        (asked,) = await send(client, message("forget everything", context=context))
        (wrong,) = [None]
        try:
            await send(client, message("maybe", context=context, task=asked.task.id))
        except A2AError as exc:
            wrong = exc
        assert wrong is not None and "yes or no" in str(wrong)
        (done,) = await send(client, message(context=context, task=asked.task.id, approve=True))
        again = await client.get_task(pb.GetTaskRequest(id=asked.task.id))
        return asked.task, done.task, again

    asked, done, again = run(go())
    assert asked.status.state == pb.TASK_STATE_INPUT_REQUIRED
    details = asked.status.message.parts[1].data.struct_value
    assert details["action"] == "forget_memories"
    assert done.id == asked.id and done.status.state == pb.TASK_STATE_COMPLETED
    assert "forgotten" in reply_text(done)
    assert again.status.state == pb.TASK_STATE_COMPLETED
    decided = agent.approvals(user_id="alice", pending=False)[0]
    assert decided["by"] == "alice" and decided["approved"] is True


def test_a_running_task_is_cancelled(api: Api) -> None:
    async def go() -> tuple[pb.Task, pb.Task]:
        client, poller = await connect(api, "alice"), await connect(api, "alice", False)
        (first,) = await send(poller, message("trickle and stall"), return_immediately=True)
        task_id = first.task.id
        async for event in client.subscribe(pb.SubscribeToTaskRequest(id=task_id)):
            if event.HasField("artifact_update"):
                break  # the reply is being written: cancel it now
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
        return cancelled, await client.get_task(pb.GetTaskRequest(id=task_id))

    cancelled, again = run(go())
    assert cancelled.status.state == pb.TASK_STATE_CANCELED
    assert again.status.state == pb.TASK_STATE_CANCELED


def test_a_subscription_resumes_from_the_log_after_redis_is_flushed(
    api: Api, worker_settings: Settings
) -> None:
    async def go() -> list[pb.StreamResponse]:
        client, poller = await connect(api, "alice"), await connect(api, "alice", False)
        (first,) = await send(poller, message("ponder then trickle"), return_immediately=True)
        redis.Redis.from_url(worker_settings.redis_url).flushdb()
        return [e async for e in client.subscribe(pb.SubscribeToTaskRequest(id=first.task.id))]

    events = run(go())
    assert events[0].HasField("task")
    assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
    final = events[-1].status_update.status.message.parts[0].text
    assert final == "".join(f"part {n} " for n in range(1, 13))


def test_another_users_task_and_context_read_as_missing(api: Api, agent: AgentClient) -> None:
    async def go() -> list[str]:
        alice, bob = await connect(api, "alice", streaming=False), await connect(api, "bob", False)
        (mine,) = await send(alice, message("hello"))
        found = []
        for call in (
            bob.get_task(pb.GetTaskRequest(id=mine.task.id)),
            bob.cancel_task(pb.CancelTaskRequest(id=mine.task.id)),
            send(bob, message("hi", context=mine.task.context_id)),
        ):
            try:
                await call
            except A2AError as exc:
                found.append(str(exc))
        listed = await bob.list_tasks(pb.ListTasksRequest())
        assert mine.task.id not in [t.id for t in listed.tasks]
        return found

    refusals = run(go())
    assert len(refusals) == 3 and all("unknown" in text for text in refusals), refusals


async def _drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


def test_a2a_streams_count_against_the_process_cap(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    keys = new_keys("alice")
    folder = tmp_path_factory.mktemp("capped")
    with serving(worker_settings, folder, keys, AGENTSTATE_MAX_STREAMS="1") as capped:

        async def go() -> str:
            client, poller = await connect(capped, "alice"), await connect(capped, "alice", False)
            for _ in range(3):  # each stream gives its slot back when it ends
                events = await send(client, message("what is 2+2?"))
                assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
            (first,) = await send(poller, message("ponder then trickle"), return_immediately=True)
            subscription = client.subscribe(pb.SubscribeToTaskRequest(id=first.task.id))
            await anext(subscription)  # the one slot is held
            try:
                await send(client, message("and another"))
            except Exception as exc:  # the service's 503 for a full house
                refused = str(exc)
            else:
                refused = ""
            await subscription.aclose()
            return refused

        refused = run(go())
    assert "503" in refused or "MAX_STREAMS" in refused, refused
