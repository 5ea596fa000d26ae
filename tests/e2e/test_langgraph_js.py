"""LangGraph's Agent Server protocol at ``/lg`` driven by the official JavaScript SDK
(``@langchain/langgraph-sdk``, pinned by tests/e2e/langgraph_js/package-lock.json) under
node, against a real ``agentstate serve`` (uvicorn) and real workers: assistants, threads
(create, get, search), runs waited and streamed (values, messages), a run joined, a double
text rejected with the SDK's conflict error, a run cancelled, an interrupt resumed with a
Command, state and history, a bad key, and another user's thread reading as missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from tests.api_support import Api, new_keys, serving
from tests.support import Workers, agent_test_settings

pytestmark = pytest.mark.workers

AGENTS = "echo=tests.graphs:echo,approve=tests.graphs:approve,steps=tests.graphs:steps"
CLIENT_JS = Path(__file__).resolve().parent / "langgraph_js"


@pytest.fixture(scope="module")
def api(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    settings: Settings = agent_test_settings(pg_url, agents=AGENTS)
    log_dir = tmp_path_factory.mktemp("lg-js")
    workers = Workers(settings, log_dir, count=1).start()
    try:
        with serving(settings, log_dir, new_keys("alice", "bob")) as running:
            yield running
    finally:
        workers.stop()


@pytest.fixture(scope="module")
def sdk_script() -> Path:
    """@langchain/langgraph-sdk installed as its lock file pins it (npm ci, once per checkout)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed to test with @langchain/langgraph-sdk"
    if not (CLIENT_JS / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CLIENT_JS,
            check=True,
            timeout=300,
        )
    return CLIENT_JS / "run.mjs"


@pytest.fixture(scope="module")
def seen(api: Api, sdk_script: Path) -> dict[str, Any]:
    """What the JavaScript SDK got back, one run of the script for the whole module."""
    done = subprocess.run(
        ["node", str(sdk_script), f"{api.url}/lg", api.keys["alice"], api.keys["bob"]],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_assistants_and_threads(seen: dict[str, Any]) -> None:
    assert seen["assistants"] == ["default", "echo", "approve", "steps"]
    assert seen["created"] == {
        "status": "idle",
        "metadata": {"js": "yes"},
        "values": {"messages": []},
    }
    assert seen["got"] is True
    assert seen["thread_id"] in seen["searched"]


def test_runs_wait_and_stream(seen: dict[str, Any]) -> None:
    assert seen["waited"] == "echo: hi (#1)"
    stream = seen["stream"]
    assert stream["events"][0] == "metadata" and "run_id" in stream["metadata"]
    assert {"values", "messages"} <= set(stream["events"])
    chunks = stream["chunks"]
    assert chunks and len({c["id"] for c in chunks}) == 1
    assert stream["final"]["content"] == "echo: flow (#2)"
    assert stream["final"]["id"] == chunks[0]["id"]
    assert "echo: flow (#2)" in "".join(c["content"] for c in chunks)


def test_a_double_text_is_the_sdks_conflict_and_join_stream_follows(
    seen: dict[str, Any],
) -> None:
    rejected = seen["double_text"]
    assert rejected is not None and rejected["status"] == 409
    assert "Thread is already running a task" in rejected["text"]
    joined = seen["join_stream"]
    assert joined["first"] == "metadata" and joined["run_id"] == joined["slow_run_id"]
    assert joined["final"] == "all steps done for linger a bit"
    assert seen["joined_status"] == "success"


def test_cancel_interrupt_and_command_resume(seen: dict[str, Any]) -> None:
    assert seen["cancelled"] == "interrupted"
    interrupt = seen["interrupt"]
    assert interrupt["waited"][0]["value"] == {"amount": 5}
    assert interrupt["status"] == "interrupted"
    assert interrupt["task"][0]["value"] == {"amount": 5}
    assert seen["resumed"] == {"answer": "transfer approved (fine)", "status": "idle"}


def test_state_and_history(seen: dict[str, Any]) -> None:
    state = seen["state"]
    assert state["next"] == []
    assert state["messages"] == [
        ["human", "hi"],
        ["ai", "echo: hi (#1)"],
        ["human", "flow"],
        ["ai", "echo: flow (#2)"],
    ]
    assert state["checkpoint"]["thread_id"] == seen["thread_id"]
    assert state["history_len"] >= 1 and state["history_first"] == state["messages"]


def test_a_bad_key_and_another_users_thread(seen: dict[str, Any]) -> None:
    assert seen["bad_key"] is not None and seen["bad_key"]["status"] == 401
    assert seen["other_user"] is not None and seen["other_user"]["status"] == 404
    assert seen["other_user_run"] is not None and seen["other_user_run"]["status"] == 404
