"""The `agentstate` command line, run as a subprocess against real workers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.support import REPO, TEST_DB, Workers, settings_env, uid

pytestmark = pytest.mark.workers
AGENTSTATE = str(Path(__import__("sys").executable).with_name("agentstate"))


def run(
    settings: Settings,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    environment = settings_env(settings)
    environment.update(env or {})
    return subprocess.run(
        [AGENTSTATE, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def cli(worker_settings: Settings, workers: Workers) -> Settings:
    return worker_settings


def test_help_explains_every_command(cli: Settings) -> None:
    result = run(cli, "--help")
    assert result.returncode == 0
    for command in (
        "db",
        "send",
        "session",
        "user",
        "workflow",
        "recover",
        "migrate",
        "fsm",
        "demo",
        "approval",
    ):
        assert command in result.stdout


def test_db_upgrade_is_idempotent(cli: Settings) -> None:
    result = run(cli, "db", "upgrade", "--json")
    assert result.returncode == 0, result.stderr
    from state.storage.db import get_engine, head_revision

    assert json.loads(result.stdout)["revision"] == head_revision(get_engine(cli.database_url))


def test_send_wait_show_and_user(cli: Settings) -> None:
    session_id, user = uid("cli"), uid("u")
    result = run(cli, "send", session_id, "what is 12*7?", "--user", user, "--wait")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "12*7 = 84"
    assert "understanding" in result.stderr and "generating" in result.stderr  # live phases
    assert "\n  12*7 = 84" in result.stderr  # the reply's chunks, as they were streamed
    result = run(
        cli, "send", session_id, "remember that I like jazz", "--user", user, "--wait", "--json"
    )
    data = json.loads(result.stdout)
    assert data["reply"] == "Got it. I'll remember that I like jazz."
    assert data["path"][-1] == "idle"
    shown = run(cli, "session", "show", session_id)
    assert "[assistant] 12*7 = 84" in shown.stdout
    doc = json.loads(run(cli, "session", "show", session_id, "--json").stdout)
    assert doc["phase"] == "idle" and len(doc["message_history"]) == 4
    state = json.loads(run(cli, "user", "show", user).stdout)
    assert state["memories"] == ["I like jazz"]


def test_send_without_wait_prints_the_message_id(cli: Settings) -> None:
    result = run(cli, "send", uid("cli"), "hello", "--user", uid("u"), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["message_id"].startswith("msg-")


def test_bad_input_exits_2_with_one_line(cli: Settings) -> None:
    session_id = uid("cli")
    run(cli, "send", session_id, "hello", "--user", "owner")
    assert_one_line_error(run(cli, "session", "show", uid("nobody")), 2, "unknown session")
    assert_one_line_error(run(cli, "session", "show", "bad id!"), 2, "invalid session id")
    assert_one_line_error(
        run(cli, "send", session_id, "hi", "--user", "intruder"), 2, "unknown session"
    )
    assert_one_line_error(run(cli, "send", session_id, "x" * 70000, "--user", "owner"), 2, "bytes")
    assert_one_line_error(run(cli, "workflow", "show", uid("nowf")), 2, "unknown workflow")
    assert_one_line_error(run(cli, "user", "show", "not/valid"), 2, "invalid user id")
    assert_one_line_error(run(cli, "send", session_id), 2)  # missing arguments
    assert_one_line_error(run(cli, "nonsense"), 2)


def test_workflow_run_show_and_bad_specs(cli: Settings, tmp_path: Path) -> None:
    workflow_id = uid("wf")
    spec = {
        "workflow_id": workflow_id,
        "steps": [
            {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}},
            {
                "step_id": "b",
                "action": "calculate",
                "inputs": {"expression": "a*10"},
                "dependencies": ["a"],
            },
        ],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    result = run(cli, "workflow", "run", str(path), "--wait")
    assert result.returncode == 0, result.stderr
    assert "2/2 done" in result.stderr
    assert "success" in result.stdout
    doc = json.loads(run(cli, "workflow", "show", workflow_id, "--json").stdout)
    assert doc["steps"]["b"]["outputs"] == {"value": 50}

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_one_line_error(run(cli, "workflow", "run", str(bad)), 2, "not valid JSON")
    cyclic_id = uid("wf")
    bad.write_text(
        json.dumps(
            {
                "workflow_id": cyclic_id,
                "steps": [
                    {"step_id": "x", "action": "echo", "dependencies": ["y"]},
                    {"step_id": "y", "action": "echo", "dependencies": ["x"]},
                ],
            }
        )
    )
    assert_one_line_error(run(cli, "workflow", "run", str(bad)), 2, "cycle")
    assert_one_line_error(run(cli, "workflow", "show", cyclic_id), 2, "unknown workflow")
    assert_one_line_error(run(cli, "workflow", "run", str(tmp_path / "missing.json")), 2)
    stdin = json.dumps({"steps": [{"step_id": "e", "action": "echo", "inputs": {"k": 1}}]})
    piped = run(cli, "workflow", "run", "-", "--wait", "--json", stdin=stdin)
    assert json.loads(piped.stdout)["steps"]["e"]["outputs"] == {"k": 1}


def test_recover_migrate_and_fsm(cli: Settings) -> None:
    report = json.loads(run(cli, "recover", "--json").stdout)
    assert set(report) >= {"sessions_resumed", "steps_redispatched"}
    dry = json.loads(run(cli, "migrate", "--dry-run", "--json").stdout)
    assert dry["dry_run"] is True and dry["sessions"]["scanned"] >= 1
    done = run(cli, "migrate")
    assert done.returncode == 0 and "sessions:" in done.stdout
    diagram = run(cli, "fsm", "diagram").stdout
    assert diagram.startswith("stateDiagram-v2")
    assert "idle --> understanding: receive_input" in diagram


def test_an_unreachable_redis_is_one_line_and_exit_1(cli: Settings) -> None:
    env: dict[str, Any] = {
        "AGENTSTATE_REDIS_URL": "redis://:hunter2@127.0.0.1:1/0",
        "AGENTSTATE_BROKER_URL": "redis://:hunter2@127.0.0.1:1/0",
    }
    user = uid("u")
    AgentClient(cli).save_user_state(user, {"memories": ["tea"]})
    result = run(cli, "user", "show", user, env=env)
    assert result.returncode == 0, result.stderr  # the cache is optional: the database answers
    assert json.loads(result.stdout)["memories"] == ["tea"]
    assert "hunter2" not in result.stderr  # credentials never reach the terminal
    assert "Traceback" not in result.stderr


# -- what a newcomer ran into ----------------------------------------------------------


def test_read_only_commands_never_create_a_database(cli: Settings, tmp_path: Path) -> None:
    env = {"AGENTSTATE_DATABASE_URL": "sqlite:///agentstate.db"}  # the default, relative
    for command in (("session", "show", "s-1"), ("user", "show", "u-1"), ("workflow", "show", "w")):
        result = run(cli, *command, env=env, cwd=tmp_path)
        where = f"sqlite:///{tmp_path.resolve() / 'agentstate.db'}"
        assert_one_line_error(result, 2, f"no database at {where}", "AGENTSTATE_DATABASE_URL")
    assert list(tmp_path.iterdir()) == []  # no agentstate.db, no journal
    (tmp_path / "empty.db").touch()
    result = run(
        cli,
        "session",
        "show",
        "s-1",
        env={"AGENTSTATE_DATABASE_URL": "sqlite:///empty.db"},
        cwd=tmp_path,
    )
    assert_one_line_error(result, 2, "no agentstate schema", "agentstate db upgrade")
    assert (tmp_path / "empty.db").stat().st_size == 0  # looked at, not written


def test_unknown_ids_name_the_database_searched(cli: Settings) -> None:
    for command in (("session", "show"), ("user", "show"), ("workflow", "show")):
        result = run(cli, *command, uid("nobody"))
        assert_one_line_error(result, 2, f"unknown {command[0]}", TEST_DB, "postgresql")


def test_bare_groups_print_their_own_help_and_exit_2(cli: Settings) -> None:
    for group in ("fsm", "db", "session", "user", "workflow"):
        result = run(cli, group)
        assert result.returncode == 2, (group, result.stderr)
        assert result.stdout.startswith(f"usage: agentstate {group} "), result.stdout


def test_with_json_an_error_is_one_json_object_on_stdout(cli: Settings) -> None:
    result = run(cli, "session", "show", uid("nobody"), "--json")
    assert result.returncode == 2 and result.stderr == ""
    error = json.loads(result.stdout)
    assert error["kind"] == "not_found" and "unknown session" in error["error"]
    result = run(cli, "send", "s-1", "hi", "--user", "u-1", "--timeout", "0", "--json")
    assert result.returncode == 2 and result.stderr == ""
    assert json.loads(result.stdout)["kind"] == "bad_input"


def test_a_timeout_must_be_positive(cli: Settings, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"steps": [{"step_id": "a", "action": "echo"}]}))
    for value in ("-1", "0", "nan"):
        result = run(cli, "send", uid("s"), "hi", "--user", "u-1", "--wait", "--timeout", value)
        assert_one_line_error(result, 2, "--timeout")
        assert_one_line_error(
            run(cli, "workflow", "run", str(spec), "--timeout", value), 2, "--timeout"
        )


def test_run_wait_and_show_agree_a_failed_workflow_exits_1(cli: Settings, tmp_path: Path) -> None:
    workflow_id = uid("wf")
    spec = tmp_path / "spec.json"
    message = "no luck \x1b]0;pwned\x07"
    spec.write_text(json.dumps({"workflow_id": workflow_id, "steps": [
        {"step_id": "a", "action": "fail", "inputs": {"message": message}, "max_retries": 0},
    ]}))  # fmt: skip
    ran = run(cli, "workflow", "run", str(spec), "--wait")
    assert ran.returncode == 1, ran.stderr
    shown = run(cli, "workflow", "show", workflow_id)
    assert shown.returncode == 1 and "status failed" in shown.stdout
    assert "\x1b" not in shown.stdout and "\\x1b]0;pwned\\x07" in shown.stdout
    as_json = run(cli, "workflow", "show", workflow_id, "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["status"] == "failed"
    assert "exits 1 if the workflow failed" in run(cli, "workflow", "show", "--help").stdout


def test_bad_settings_are_one_line_naming_the_variable(cli: Settings) -> None:
    cases = {
        "AGENTSTATE_LOCK_TIMEOUT": "abc",
        "AGENTSTATE_DATABASE_URL": "mysql://root:hunter2@db/app",
        "AGENTSTATE_REDIS_URL": "redis://:hunter2@localhost:notaport/0",
    }
    for name, value in cases.items():
        result = run(cli, "session", "show", "s-1", env={name: value})
        assert_one_line_error(result, 2, name)
        assert "hunter2" not in result.stderr
    result = run(cli, "--help", env={"AGENTSTATE_LOCK_TIMEOUT": "abc"})
    assert result.returncode == 0  # help needs no settings


def test_a_deeply_nested_spec_is_bad_input(cli: Settings, tmp_path: Path) -> None:
    spec = tmp_path / "deep.json"
    spec.write_text("[" * 100000)
    assert_one_line_error(run(cli, "workflow", "run", str(spec)), 2, "nested too deeply")


def test_stored_control_characters_are_escaped_for_the_terminal(cli: Settings) -> None:
    session_id, user = uid("cli"), uid("u")
    text = "remember that \x1b]0;pwned\x07 is\nmy title"
    sent = run(cli, "send", session_id, text, "--user", user, "--wait")
    assert sent.returncode == 0, sent.stderr
    assert "\x1b" not in sent.stdout and "\\x1b]0;pwned\\x07" in sent.stdout
    shown = run(cli, "session", "show", session_id)
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "[user] remember that \\x1b]0;pwned\\x07 is\nmy title" in shown.stdout
    stored = json.loads(run(cli, "session", "show", session_id, "--json").stdout)
    assert stored["message_history"][0]["content"] == text  # escaped on screen only


def test_send_takes_a_multitask_strategy(cli: Settings) -> None:
    session_id, user = uid("cli"), uid("u")
    sent = run(cli, "send", session_id, "what is 2*8?", "--user", user, "--multitask", "reject")
    assert sent.returncode == 0, sent.stderr  # a resting session takes it
    waited = run(
        cli,
        "send",
        session_id,
        "what is 3*8?",
        "--user",
        user,
        "--multitask",
        "interrupt",
        "--wait",
    )
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.strip() in {"3*8 = 24"}
    bad = run(cli, "send", session_id, "hi", "--user", user, "--multitask", "shout")
    assert bad.returncode == 2 and "multitask" in bad.stderr
