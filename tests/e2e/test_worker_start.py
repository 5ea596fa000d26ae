"""`celery -A tasks worker` imports its agent at start: a bad one is refused with one line,
and an agent module in the folder the worker runs in is found (as a newcomer runs it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings, child_environment
from tasks.client import AgentClient
from tests.support import make_settings, uid

pytestmark = pytest.mark.workers
# The console script, not `python -m celery`: only the latter puts the current folder on
# sys.path by itself, and a newcomer types `celery`.
CELERY = str(Path(sys.executable).with_name("celery"))
SHOUT_AGENT = """
from state.agent import PhaseContext, PhaseResult


def generating(ctx: PhaseContext) -> PhaseResult:
    return PhaseResult(trigger="response_sent", reply=ctx.message.upper() + "!")
"""


def worker_env(settings: Settings) -> dict[str, str]:
    env = child_environment(settings)
    env.pop("PYTHONPATH", None)  # the agent must be found through the current folder alone
    return env


def start_worker(settings: Settings, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [CELERY, "-A", "tasks", "worker", "--concurrency=1", "--loglevel=WARNING",
             "--without-mingle", "--without-gossip", f"--hostname={uid('w')}@localhost"],
            cwd=cwd,
            env=worker_env(settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "shout_agent.py").write_text(SHOUT_AGENT)
    return folder


def test_a_worker_whose_agent_cannot_be_imported_refuses_to_start(
    pg_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pg_url, queue=uid("q"), agent="shout_agent")
    proc = start_worker(settings, tmp_path, tmp_path / "worker.log")
    try:
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (tmp_path / "worker.log").read_text()
    assert status != 0, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    assert "cannot import agent 'shout_agent'" in lines[0]
    assert "AGENTSTATE_AGENT" in lines[0]


def test_a_worker_whose_named_agent_cannot_be_imported_refuses_to_start(
    pg_url: str, tmp_path: Path
) -> None:
    settings = make_settings(pg_url, queue=uid("q"), agents="helper=no_such_helper:graph")
    proc = start_worker(settings, tmp_path, tmp_path / "worker.log")
    try:
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (tmp_path / "worker.log").read_text()
    assert status == 2 and len(output.strip().splitlines()) == 1, output
    assert "Traceback" not in output
    assert "no_such_helper" in output and "AGENTSTATE_AGENTS" in output


def test_a_bad_action_module_is_refused_the_same_way(pg_url: str, tmp_path: Path) -> None:
    settings = make_settings(pg_url, queue=uid("q"), action_modules="no_such_actions")
    proc = start_worker(settings, tmp_path, tmp_path / "worker.log")
    status = proc.wait(timeout=60)
    output = (tmp_path / "worker.log").read_text()
    assert status != 0 and len(output.strip().splitlines()) == 1, output
    assert "cannot import action module 'no_such_actions'" in output


@pytest.fixture
def shout_worker(pg_url: str, agent_dir: Path, tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(pg_url, queue=uid("q"), agent="shout_agent")
    proc = start_worker(settings, agent_dir, tmp_path / "shout.log")
    try:
        yield settings
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_an_agent_module_in_the_current_folder_is_found_and_answers(
    shout_worker: Settings, tmp_path: Path
) -> None:
    client = AgentClient(shout_worker)
    session_id = uid("s")
    client.send_message(session_id, "hello there", user_id=uid("u"))
    try:
        doc = client.wait_for_idle(session_id, timeout=30)
    except TimeoutError:
        pytest.fail((tmp_path / "shout.log").read_text()[-3000:])
    assert doc["message_history"][-1]["content"] == "HELLO THERE!"
    assert "last_error" not in doc["metadata"]
