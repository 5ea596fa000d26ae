"""MCP (Streamable HTTP at ``/mcp``) on a real ``agentstate serve`` and real workers, driven
by the official ``mcp`` client: initialize (protocol 2025-11-25), list the tools (one per
agent, one per action with its declared inputs), call an action and the agent (a session
continued), and keys: none is 401, another user's session reads as unknown."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from config import Settings
from tasks.client import AgentClient
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


@pytest.fixture(scope="module")
def agent(worker_settings: Settings) -> AgentClient:
    return AgentClient(worker_settings)


async def session_of(api: Api, user: str, work: Any) -> Any:
    headers = {"Authorization": f"Bearer {api.keys[user]}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{api.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await work(session)


def test_tools_are_the_agents_and_the_actions(api: Api) -> None:
    async def work(session: ClientSession) -> Any:
        return session.protocol_version, (await session.list_tools()).tools

    version, tools = asyncio.run(session_of(api, "alice", work))
    assert version == "2025-11-25"
    by_name = {tool.name: tool for tool in tools}
    assert {"ask_default", "calculate", "echo", "sleep", "fail"} <= set(by_name)
    assert by_name["ask_default"].input_schema["required"] == ["message"]
    assert by_name["calculate"].input_schema["properties"]["expression"]["type"] == "string"


def test_calling_an_action_and_the_agent(api: Api, agent: AgentClient) -> None:
    async def work(session: ClientSession) -> Any:
        calculated = await session.call_tool("calculate", {"expression": "6*7"})
        failed = await session.call_tool("fail", {"message": "on purpose"})
        first = await session.call_tool("ask_default", {"message": "remember that tea is hot"})
        session_id = first.structured_content["session_id"]
        second = await session.call_tool(
            "ask_default", {"message": "what do you remember?", "session_id": session_id}
        )
        unknown = await session.call_tool("no_such_tool", {})
        return calculated, failed, first, second, unknown

    calculated, failed, first, second, unknown = asyncio.run(session_of(api, "alice", work))
    assert calculated.structured_content == {"value": 42} and not calculated.is_error
    assert '"value":42' in calculated.content[0].text.replace(" ", "")
    assert failed.is_error and "on purpose" in failed.content[0].text
    assert "tea is hot" in first.content[0].text and "tea is hot" in second.content[0].text
    assert second.structured_content["reply"] == second.content[0].text
    session_id = second.structured_content["session_id"]
    stored = agent.get_session(session_id)
    assert stored is not None and stored["user_id"] == "alice"
    assert [m["role"] for m in stored["message_history"]] == ["user", "assistant"] * 2
    assert unknown.is_error


def test_keys_and_scoping(api: Api, agent: AgentClient) -> None:
    assert httpx.post(f"{api.url}/mcp", json={}).status_code == 401

    async def alices(session: ClientSession) -> str:
        made = await session.call_tool("ask_default", {"message": "hello"})
        return str(made.structured_content["session_id"])

    session_id = asyncio.run(session_of(api, "alice", alices))
    before = agent.get_session(session_id)

    async def bobs(session: ClientSession) -> Any:
        return await session.call_tool("ask_default", {"message": "hi", "session_id": session_id})

    refused = asyncio.run(session_of(api, "bob", bobs))
    assert refused.is_error and refused.content[0].text == "unknown session"
    assert agent.get_session(session_id) == before
