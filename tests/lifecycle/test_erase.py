"""Erasing a user through real workers, Postgres and Redis: afterwards nothing in any
table or any Redis key names the user, their sessions or their workflows; another
user's data is exactly as it was; erasing again deletes nothing; a turn in flight
leaves nothing behind; the command line refuses without --yes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from state.storage import keys
from state.webhooks.hooks import HookStore
from tasks.client import AgentClient
from tests.lifecycle.scan import keys_naming, rows_naming
from tests.support import REPO, settings_env, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module", autouse=True)
def _hooks_removed(client: AgentClient) -> Iterator[None]:
    """Hooks are global (an operator's hears every session): the ones these tests add go
    at the end, or later modules' turns would keep writing deliveries for them."""
    hooks = HookStore(client.backend.engine)
    before = {hook["webhook_id"] for hook in hooks.listing()}
    yield
    for hook in hooks.listing():
        if hook["webhook_id"] not in before:
            hooks.remove(hook["webhook_id"])


AGENTSTATE = str(Path(sys.executable).with_name("agentstate"))


@pytest.fixture(autouse=True, scope="module")
def _operator_hooks_removed(client: AgentClient) -> Iterator[None]:
    """The operator's hooks ``populate`` adds go with this module: they would otherwise
    keep writing deliveries that name later modules' sessions (which those modules'
    scans of every table would find)."""
    yield
    hooks = HookStore(client.backend.engine)
    for hook in hooks.listing():
        if hook["user_id"] is None:
            hooks.remove(hook["webhook_id"])


def populate(client: AgentClient, user: str) -> list[str]:
    """A user with a bit of everything: history, user state, a fork, a workflow of a
    session, a step and a turn waiting for approval. Returns every id it made."""
    talk, fork, asking = uid("talk"), uid("fork"), uid("ask")
    # Their webhook (and an operator's) hears their turns: deliveries that name them.
    hooks = HookStore(client.backend.engine)
    for owner in (user, None):
        hooks.add("http://127.0.0.1:9/h", ["turn.completed"], user_id=owner, allow_private=True)
    client.create_schedule(uid("sch"), every_seconds=3600, user_id=user, session_id=talk, text="x")
    client.send_message(talk, "remember that cats purr", user_id=user)
    client.send_message(talk, "what is 6*7?", user_id=user)
    client.wait_for_idle(talk, timeout=60)
    revision = client.revisions(talk)[-1]["revision"]
    client.fork_session(talk, revision, fork)
    client.send_message(fork, "what is 2+2?", user_id=user)
    done = client.start_workflow(
        {"session_id": talk, "steps": [{"step_id": "a", "action": "echo", "inputs": {"x": 1}}]}
    )
    gated = client.start_workflow(
        {
            "session_id": talk,
            "steps": [{"step_id": "gate", "action": "echo", "inputs": {}, "approval": True}],
        }
    )
    client.send_message(asking, "risky business", user_id=user)
    client.wait_for_workflow(done, timeout=60)
    client.wait_for_idle(fork, timeout=60)
    assert client.wait_for_idle(asking, timeout=60)["phase"] == "awaiting_approval"
    assert client.load_user_state(user)
    return [user, talk, fork, asking, done, gated]


def everything(client: AgentClient, ids: list[str]) -> tuple[Any, Any]:
    rows = rows_naming(client.backend.engine, ids)
    # Workers go on trying deliveries meanwhile (attempts, next try): a delivery is the
    # same one while its id is.
    if "webhook_deliveries" in rows:
        rows["webhook_deliveries"] = [r[1:].split(",")[0] for r in rows["webhook_deliveries"]]
    return rows, keys_naming(client.backend.redis, ids)


def test_erase_leaves_nothing_of_the_user_and_touches_no_one_else(client: AgentClient) -> None:
    gone, kept = uid("gone"), uid("kept")
    gone_ids, kept_ids = populate(client, gone), populate(client, kept)
    client.get_session(gone_ids[1])  # a cached copy, at least
    rows, found_keys = everything(client, gone_ids)
    assert {"sessions", "messages", "events", "revisions", "workflows", "workflow_steps"} <= set(
        rows
    ), rows.keys()
    assert {"approvals", "user_state", "inbox"} <= set(rows)
    assert {"schedules", "webhooks", "webhook_deliveries"} <= set(rows)
    assert any(keys.owner_of(k) == ("session", gone_ids[1]) for k in found_keys)
    before = everything(client, kept_ids)

    counts = client.erase_user(gone)

    assert counts["sessions"] == 3 and counts["user_state"] == 1, counts
    assert counts["workflows"] == 2 and counts["steps"] == 2 and counts["approvals"] == 2
    assert counts["messages"] > 0 and counts["events"] > 0 and counts["revisions"] > 0
    assert counts["redis_keys"] > 0
    assert everything(client, gone_ids) == ({}, {})
    assert everything(client, kept_ids) == before
    assert client.get_session(gone_ids[1]) is None
    assert client.load_user_state(gone) == {}
    again = client.erase_user(gone)
    assert again and set(again.values()) == {0}, again
    assert everything(client, kept_ids) == before


def test_a_turn_in_flight_leaves_nothing_behind(client: AgentClient) -> None:
    user = uid("racer")
    sessions = [uid("race") for _ in range(4)]
    for session_id in sessions:  # executing lingers: erasure lands mid-turn
        client.send_message(session_id, "remember that linger is slow", user_id=user)
    wait_until(lambda: all(phase_of(client, s) not in (None, "idle") for s in sessions))
    wait_until(lambda: any(phase_of(client, s) == "executing" for s in sessions))
    counts = client.erase_user(user)
    assert counts["sessions"] == len(sessions), counts
    time.sleep(4.0)  # the handlers finish, their commits find nothing, the workers move on
    assert everything(client, [user, *sessions]) == ({}, {})
    # The user may come back: a new message opens a new session as usual.
    client.send_message(sessions[0], "what is 1+1?", user_id=user)
    doc = client.wait_for_idle(sessions[0], timeout=60)
    assert [m["role"] for m in doc["message_history"]] == ["user", "assistant"]


def test_a_step_running_when_erased_leaves_nothing_behind(client: AgentClient) -> None:
    user, session_id = uid("stepper"), uid("s")
    client.send_message(session_id, "what is 1+1?", user_id=user)
    client.wait_for_idle(session_id, timeout=60)
    workflow_id = client.start_workflow(
        {
            "session_id": session_id,
            "steps": [
                {"step_id": "nap", "action": "sleep", "inputs": {"seconds": 1.5}},
                {"step_id": "after", "action": "echo", "inputs": {}, "dependencies": ["nap"]},
            ],
        }
    )
    wait_until(lambda: _step_status(client, workflow_id) == "running")
    client.erase_user(user)
    time.sleep(3.0)  # the step ends, its commit finds nothing, its dependent never runs
    assert everything(client, [user, session_id, workflow_id]) == ({}, {})


def _step_status(client: AgentClient, workflow_id: str) -> str | None:
    doc = client.get_workflow(workflow_id)
    return None if doc is None else str(doc["steps"]["nap"]["status"])


def test_a_turn_streaming_when_erased_leaves_no_chunks_behind(client: AgentClient) -> None:
    user, session_id = uid("streamer"), uid("stream")
    client.send_message(session_id, "trickle slowly", user_id=user)
    redis_client = client.backend.redis
    wait_until(lambda: redis_client.llen(keys.session_chunks(session_id)) > 2)
    client.erase_user(user)
    time.sleep(3.0)  # the handler streams its last chunks, its commit finds nothing
    assert everything(client, [user, session_id]) == ({}, {})


def test_erase_on_the_command_line(client: AgentClient, settings: Settings) -> None:
    user = uid("cli")
    session_id = uid("s")
    client.send_message(session_id, "what is 3*3?", user_id=user)
    client.wait_for_idle(session_id, timeout=60)
    refused = cli(settings, "user", "erase", user)
    assert refused.returncode == 2, refused.stderr
    assert "--yes" in refused.stderr and "Traceback" not in refused.stderr
    assert client.get_session(session_id) is not None
    assert cli(settings, "user", "erase", "bad id!", "--yes").returncode == 2
    done = cli(settings, "user", "erase", user, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts["sessions"] == 1 and counts["messages"] == 2
    assert client.get_session(session_id) is None
    human = cli(settings, "user", "erase", user, "--yes")
    assert human.returncode == 0 and "erased" in human.stdout


def cli(
    settings: Settings, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSTATE, *args],
        cwd=REPO,
        env={**settings_env(settings), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def phase_of(client: AgentClient, session_id: str) -> str | None:
    doc = client.get_session(session_id, history_limit=0)
    return None if doc is None else str(doc["phase"])


def wait_until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)
