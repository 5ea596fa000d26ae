"""MCP Tasks (revision 2025-11-25) on a real ``agentstate serve`` and real workers, driven by
the official ``mcp`` client's session (its typed requests; the client has no Tasks helper):
the capability, an action and the agent run as tasks polled to completion, a turn parked
on an approval as ``input_required``, a task cancelled, another user's task missing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from config import Settings
from tests.api_support import Api, new_keys, serving
from tests.support import Workers

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    keys = new_keys("alice", "bob", "*")
    with serving(worker_settings, tmp_path_factory.mktemp("serve"), keys) as running:
        yield running


async def session_of(api: Api, user: str, work: Any) -> Any:
    headers = {"Authorization": f"Bearer {api.keys[user]}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{api.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await work(session)


async def start(session: ClientSession, name: str, arguments: dict[str, Any]) -> types.Task:
    """A task-augmented ``tools/call``. mcp 2.3.0's session checks every ``tools/call``
    answer as a ``CallToolResult`` (it has no Tasks API), so this one request goes through
    its dispatcher's raw method; the answer is then checked as the spec's
    ``CreateTaskResult``."""
    params = types.CallToolRequestParams(name=name, arguments=arguments, task=types.TaskMetadata())
    dumped = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw = await session._dispatcher.send_raw_request("tools/call", dumped, {})
    return types.CreateTaskResult.model_validate(raw).task


async def get(session: ClientSession, task_id: str) -> types.GetTaskResult:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, types.GetTaskResult)


async def poll(session: ClientSession, task_id: str, until: set[str]) -> types.GetTaskResult:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        task = await get(session, task_id)
        if task.status in until:
            return task
        await asyncio.sleep(0.2)
    raise AssertionError(f"task {task_id} never reached {until}")


async def result(session: ClientSession, task_id: str) -> types.CallToolResult:
    params = types.GetTaskPayloadRequestParams(task_id=task_id)
    return await session.send_request(
        types.GetTaskPayloadRequest(params=params), types.CallToolResult
    )


def test_tools_run_as_tasks_polled_to_completion(api: Api) -> None:
    async def work(session: ClientSession) -> Any:
        caps = session.server_capabilities
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        action = await start(session, "calculate", {"expression": "6*7"})
        turn = await start(session, "ask_default", {"message": "what is 12*7?"})
        done = [await poll(session, t.task_id, {"completed", "failed"}) for t in (action, turn)]
        answers = [await result(session, t.task_id) for t in (action, turn)]
        tasks = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        return caps, listed, action, done, answers, tasks, turn

    caps, listed, action, done, answers, tasks, turn = asyncio.run(session_of(api, "alice", work))
    by_id = {task.task_id: task.status for task in tasks.tasks}
    assert by_id[action.task_id] == by_id[turn.task_id] == "completed"
    assert caps is not None and caps.tasks is not None and caps.tasks.list is not None
    assert caps is not None and caps.tasks is not None
    assert caps.tasks.requests is not None and caps.tasks.requests.tools is not None
    assert caps.tasks.requests.tools.call is not None
    assert listed["calculate"].execution is not None
    assert listed["calculate"].execution.task_support == "optional"
    assert action.task_id.startswith("workflow.") and action.status == "working"
    assert [t.status for t in done] == ["completed", "completed"]
    assert answers[0].structured_content == {"value": 42}
    assert answers[1].structured_content is not None
    assert "84" in str(answers[1].structured_content["reply"])


def test_an_approval_is_input_required_and_a_task_is_cancelled(api: Api) -> None:
    async def work(session: ClientSession) -> Any:
        asked = await start(session, "ask_default", {"message": "forget everything"})
        waiting = await poll(session, asked.task_id, {"input_required", "completed"})
        slow = await start(session, "sleep", {"seconds": 30})
        cancel = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=slow.task_id))
        cancelled = await session.send_request(cancel, types.CancelTaskResult)
        final = await poll(session, slow.task_id, {"cancelled", "completed", "failed"})
        return waiting, cancelled, final

    waiting, cancelled, final = asyncio.run(session_of(api, "alice", work))
    assert waiting.status == "input_required"
    assert cancelled.task_id.startswith("workflow.")
    assert final.status == "cancelled"


def test_another_users_task_is_missing(api: Api) -> None:
    async def mine(session: ClientSession) -> str:
        return (await start(session, "calculate", {"expression": "1+1"})).task_id

    task_id = asyncio.run(session_of(api, "alice", mine))

    async def theirs(session: ClientSession) -> list[str]:
        listed = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        assert task_id not in {task.task_id for task in listed.tasks}
        errors = []
        for task in (task_id, "turn.nope", "other"):
            try:
                await get(session, task)
            except MCPError as exc:
                errors.append(str(exc))
        return errors

    errors = asyncio.run(session_of(api, "bob", theirs))
    assert len(errors) == 3 and all("unknown task" in e for e in errors)
