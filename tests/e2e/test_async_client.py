"""The asyncio client through real workers: every AgentClient method as a coroutine, events
as an async iterator woken by the shared push (chunks too), forty sessions driven at once
from one event loop, and a client created before a fork working in the child."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest

from config import Settings
from state.errors import InvalidPayloadError, NotFoundError, SessionBusyError
from state.storage import keys
from tasks.client import AgentClient, AsyncAgentClient
from tests.agents import TRICKLE_CHUNKS
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers
SESSIONS = 40


@pytest.fixture(scope="module")
def async_settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def workers(async_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    pool = Workers(async_settings, tmp_path_factory.mktemp("async"), count=2).start()
    yield
    pool.stop()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_forty_sessions_from_one_event_loop_are_all_answered(
    async_settings: Settings, workers: None
) -> None:
    async def main() -> list[dict[str, Any]]:
        async with AsyncAgentClient(async_settings) as client:
            user = uid("u")
            sessions = [uid("s") for _ in range(SESSIONS)]
            await asyncio.gather(
                *(
                    client.send_message(s, f"what is {n}*2?", user_id=user)
                    for n, s in enumerate(sessions)
                )
            )
            return list(
                await asyncio.gather(*(client.wait_for_idle(s, timeout=90) for s in sessions))
            )

    docs = run(main())
    assert [d["message_history"][-1]["content"] for d in docs] == [
        f"{n}*2 = {n * 2}" for n in range(SESSIONS)
    ]


def test_events_follow_with_chunks_and_read_like_the_sync_client(
    async_settings: Settings, workers: None
) -> None:
    session_id, user = uid("s"), uid("u")

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with AsyncAgentClient(async_settings) as client:
            followed: list[dict[str, Any]] = []

            async def follow(after: int) -> None:
                events = client.events(session_id, after, follow=True, timeout=60, tokens=True)
                async for item in events:
                    followed.append(item)
                    if item["kind"] == "reply":
                        return

            await client.send_message(session_id, "hello", user_id=user)
            await client.wait_for_idle(session_id)
            after = [e async for e in client.events(session_id)][-1]["seq"]
            task = asyncio.create_task(follow(after))
            # Chunks sent before the follower listens are not replayed once the reply is
            # durable: send once the server has confirmed its subscription.
            await asyncio.wait_for(listening(client, keys.session_tokens(session_id)), 10)
            await client.send_message(session_id, "trickle please", user_id=user)
            await asyncio.wait_for(task, 60)
            logged = [e async for e in client.events(session_id)]
            return followed, logged

    followed, logged = run(main())
    chunks = [i["data"]["n"] for i in followed if i["kind"] == "token"]
    assert chunks == list(range(1, TRICKLE_CHUNKS + 1))
    sync = AgentClient(async_settings)
    assert logged == list(sync.events(session_id))
    durable = [i for i in followed if i["seq"]]
    assert durable == [e for e in logged if durable[0]["seq"] <= e["seq"] <= durable[-1]["seq"]]


async def listening(client: AsyncAgentClient, channel: str) -> None:
    hub = client._open().hub
    while not hub.listening(channel):
        await asyncio.sleep(0.01)


def test_every_method_answers_as_the_sync_one(async_settings: Settings, workers: None) -> None:
    session_id, user = uid("s"), uid("u")
    sync = AgentClient(async_settings)

    async def main() -> dict[str, Any]:
        async with AsyncAgentClient(async_settings) as client:
            out: dict[str, Any] = {}
            await client.send_message(session_id, "remember that owls hoot", user_id=user)
            out["idle"] = await client.wait_for_idle(session_id, user_id=user)
            out["session"] = await client.get_session(session_id, user_id=user, history_limit=1)
            out["other"] = await client.get_session(session_id, user_id=uid("u"))
            out["revisions"] = await client.revisions(session_id)
            first = out["revisions"][1]["revision"]
            out["then"] = await client.get_session(session_id, revision=first)
            out["fork"] = await client.fork_session(session_id, first, f"{session_id}-f")
            out["memory"] = await client.load_user_state(user)
            await client.save_user_state(user, {"memories": ["tea"]})
            out["saved"] = await client.load_user_state(user)
            workflow_id = await client.start_workflow(
                {
                    "steps": [
                        {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}}
                    ]
                }
            )
            out["workflow"] = await client.wait_for_workflow(workflow_id, timeout=60)
            out["got_workflow"] = await client.get_workflow(workflow_id)
            out["sessions"] = await client.list_sessions(user_id=user)
            out["workflows"] = await client.list_workflows(status="success", limit=1)
            out["approvals"] = await client.approvals(user_id=user)
            out["cancelled"] = await client.cancel_turn(session_id)
            with pytest.raises(NotFoundError):
                await client.wait_for_idle(uid("nobody"), timeout=1)
            with pytest.raises(NotFoundError):
                [e async for e in client.events(uid("nobody"))]
            with pytest.raises(InvalidPayloadError):
                await client.send_message(session_id, "x", user_id=user, multitask_strategy="no")
            await client.send_message(session_id, "linger, what is 1+1?", user_id=user)
            with pytest.raises(SessionBusyError):
                await client.send_message(
                    session_id, "what is 2+2?", user_id=user, multitask_strategy="reject"
                )
            await client.wait_for_idle(session_id)
            return out

    out = run(main())
    assert out["idle"]["message_history"][-1]["content"].startswith("Got it")
    assert out["session"]["message_history"] == out["idle"]["message_history"][-1:]
    assert len(out["session"]["message_history"]) == 1 and out["other"] is None
    assert out["then"] == sync.get_session(session_id, revision=out["revisions"][1]["revision"])
    assert out["fork"] == f"{session_id}-f"
    assert out["memory"] == {"memories": ["owls hoot"], "_version": out["memory"]["_version"]}
    assert out["saved"]["memories"] == ["tea"] and sync.load_user_state(user)["memories"] == ["tea"]
    assert out["workflow"]["status"] == "success" and out["got_workflow"] == out["workflow"]
    assert out["workflow"]["steps"]["a"]["outputs"] == {"value": 5}
    assert [s["session_id"] for s in out["sessions"]["items"]] == [f"{session_id}-f", session_id]
    assert len(out["workflows"]["items"]) == 1 and out["approvals"] == []
    assert out["cancelled"] is False


def _child(settings: Settings, client: AsyncAgentClient, session_id: str, results: Any) -> None:
    async def main() -> str:
        await client.send_message(session_id, "what is 5*5?", user_id="forked-user")
        doc = await client.wait_for_idle(session_id, timeout=60)
        return str(doc["message_history"][-1]["content"])

    results.put(asyncio.run(main()))


def test_a_client_made_before_a_fork_works_in_the_child(
    async_settings: Settings, workers: None
) -> None:
    client = AsyncAgentClient(async_settings)

    async def warm() -> None:
        await client.send_message(uid("s"), "hello", user_id="forked-user")

    run(warm())  # the parent has used it (its loop is gone now, as in a pre-fork server)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [
        context.Process(target=_child, args=(async_settings, client, uid("s"), results))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    answers = [results.get(timeout=90) for _ in children]
    for child in children:
        child.join(30)
    assert answers == ["5*5 = 25", "5*5 = 25"]
