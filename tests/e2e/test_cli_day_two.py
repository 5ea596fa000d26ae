"""The command line as a newcomer meets it: app modules found in the current folder,
`send --wait` that knows a turn waiting for approval and a failed turn, empty messages
refused, pipes closed early, users with sessions only, tables with headers."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.e2e.test_cli import AGENTSTATE, assert_one_line_error, run
from tests.support import Workers, agent_test_settings, settings_env, uid

pytestmark = pytest.mark.workers
APP_ACTIONS = """
from tasks.actions import action


@action("double")
def double(inputs, deps, context):
    return {"value": inputs["x"] * 2}
"""
SPEC = {
    "steps": [
        {"step_id": "a", "action": "double", "inputs": {"x": 21}},
        {"step_id": "b", "action": "echo", "inputs": {"after": "a"}, "dependencies": ["a"]},
    ]
}


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("app")
    (folder / "app_actions.py").write_text(APP_ACTIONS)
    (folder / "broken_actions.py").write_text("raise RuntimeError('broken on import')\n")
    (folder / "spec.json").write_text(json.dumps(SPEC))
    return folder


@pytest.fixture(scope="module")
def cli(pg_url: str, app_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    # The test agent (approvals on "risky", a failing planner on "explode") and the app's
    # actions, which only the app's folder holds: the workers start there, as celery would.
    settings = agent_test_settings(pg_url, action_modules="app_actions")
    pool = Workers(settings, tmp_path_factory.mktemp("workers"), count=1, concurrency=2)
    pool.cwd = app_dir
    pool.start()
    yield settings
    pool.stop()


def test_workflow_run_imports_the_action_modules_from_the_current_folder(
    cli: Settings, app_dir: Path
) -> None:
    result = run(cli, "workflow", "run", "spec.json", "--wait", "--json", cwd=app_dir)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "success"
    assert doc["steps"]["a"]["outputs"] == {"value": 42}


def test_json_prints_the_error_document_when_a_module_cannot_be_imported(
    cli: Settings, app_dir: Path, tmp_path: Path
) -> None:
    # The same setting, run from a folder without the module: one line, one JSON document.
    spec = str(app_dir / "spec.json")
    result = run(cli, "workflow", "run", spec, "--json", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout) == {
        "error": "cannot import action module 'app_actions' (AGENTSTATE_ACTION_MODULES): "
        "No module named 'app_actions'",
        "kind": "bad_input",
    }
    broken = run(
        cli,
        "workflow",
        "run",
        "spec.json",
        cwd=app_dir,
        env={"AGENTSTATE_ACTION_MODULES": "broken_actions"},
    )
    assert_one_line_error(
        broken, 2, "cannot import action module 'broken_actions'", "broken on import"
    )


def test_send_wait_returns_when_the_turn_waits_for_an_approval(cli: Settings) -> None:
    session_id, user = uid("s"), uid("u")
    result = run(cli, "send", session_id, "risky move", "--user", user, "--wait", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["reply"] is None and doc["path"][-1] == "awaiting_approval"
    waiting = doc["awaiting_approval"]
    assert waiting["action"] == "risky" and waiting["args"] == {"session": session_id}

    other = uid("s")
    text = run(cli, "send", other, "risky again", "--user", user, "--wait")
    assert text.returncode == 0, text.stderr
    first, approve, reject = text.stdout.splitlines()
    approval_id = first.split()[3].rstrip(":")
    assert first.startswith(f"waiting for approval {approval_id}: risky ")
    assert reject.split()[1:] == ["agentstate", "approval", "reject", approval_id, "--by", "NAME"]
    # The command it prints is the one that decides.
    decide = [word.replace("NAME", "kim") for word in approve.split()[2:]]
    assert run(cli, *decide).returncode == 0
    assert AgentClient(cli).wait_for_idle(other, timeout=30)["phase"] == "idle"


def test_send_wait_exits_1_when_the_turn_fails(cli: Settings) -> None:
    session_id, user = uid("s"), uid("u")
    result = run(cli, "send", session_id, "please explode", "--user", user, "--wait")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "sorry" in result.stdout.lower()
    assert "the turn failed (error in planning: RuntimeError: the planner exploded" in (
        result.stderr
    )
    as_json = run(cli, "send", session_id, "explode again", "--user", user, "--wait", "--json")
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["failed"] is True and doc["error"]["phase"] == "planning"
    fine = run(cli, "send", session_id, "what is 2*3?", "--user", user, "--wait")
    assert fine.returncode == 0 and fine.stdout.strip() == "2*3 = 6"


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_text_is_refused_and_stores_nothing(cli: Settings, text: str) -> None:
    session_id = uid("s")
    result = run(cli, "send", session_id, text, "--user", uid("u"))
    assert_one_line_error(result, 2, "message is empty (or only whitespace)")
    assert AgentClient(cli).get_session(session_id) is None


def test_user_show_for_a_user_with_sessions_but_no_state(cli: Settings) -> None:
    user = uid("u")
    AgentClient(cli).send_message(uid("s"), "hello", user_id=user)
    result = run(cli, "user", "show", user)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {}
    nobody = run(cli, "user", "show", uid("nobody"))
    assert_one_line_error(nobody, 2, "unknown user")


def test_list_outputs_have_a_header_row_and_approvals_show_their_args(cli: Settings) -> None:
    user, client = uid("u"), AgentClient(cli)
    client.send_message(uid("s"), "risky business", user_id=user)
    deadline = time.monotonic() + 30
    while not client.approvals(user_id=user) and time.monotonic() < deadline:
        time.sleep(0.05)
    header, *rows = run(cli, "approval", "list", "--user", user).stdout.splitlines()
    assert header.split()[:3] == ["APPROVAL_ID", "ACTION", "ARGS"]
    assert len(rows) == 1 and '{"session": "s-' in rows[0]
    sessions = run(cli, "session", "list", "--user", user).stdout.splitlines()
    assert sessions[0].split() == ["SESSION_ID", "USER_ID", "PHASE", "STATUS"]
    assert sessions[1].split()[1:] == [user, "awaiting_approval", "paused"]
    workflows = run(cli, "workflow", "list", "--limit", "1").stdout.splitlines()
    assert workflows[0].split() == ["WORKFLOW_ID", "STATUS", "DONE_STEPS", "TOTAL_STEPS"]


def test_a_reader_that_stops_early_ends_the_command_quietly(cli: Settings) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        result = subprocess.run(
            [AGENTSTATE, "fsm", "diagram"],
            env=settings_env(cli),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")
    piped = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{AGENTSTATE} session list --limit 200 | head -1"],
        env=settings_env(cli),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (piped.returncode, piped.stderr) == (0, ""), piped.stderr
