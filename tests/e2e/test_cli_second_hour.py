"""The command line in a newcomer's second hour: a bad URL's hint printed whole, a bad
setting refused by every command, an empty message that creates nothing, and in a real
terminal (a pseudo-terminal of a set width) rows that fit and a streamed reply shown once."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tasks.cli.terminal import ELLIPSIS
from tasks.client import AgentClient
from tests.e2e.test_cli import AGENTSTATE, assert_one_line_error, run
from tests.support import Workers, agent_test_settings, settings_env, uid

READ_TIMEOUT_S = 120.0  # a bound on waiting for the command, not a timing assertion


def in_terminal(
    settings: Settings, *args: str, columns: int = 80, cwd: Path | None = None
) -> tuple[int, str]:
    """Run ``agentstate ARGS`` with stdin, stdout and stderr on one pseudo-terminal
    ``columns`` wide; return its exit status and everything the terminal showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in settings_env(settings).items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [AGENTSTATE, *args], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd
    )
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            shown += data
        status = proc.wait(timeout=READ_TIMEOUT_S)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return status, shown.decode("utf-8", "replace").replace("\r\n", "\n")


def test_a_malformed_url_is_explained_whole(tmp_path: Path) -> None:
    # The hint spells a URL's shape; redaction once took it for credentials to hide.
    env = {"AGENTSTATE_REDIS_URL": "localhost:6379"}
    result = run(Settings(), "session", "show", "s-1", env=env, cwd=tmp_path)
    assert_one_line_error(result, 2, "AGENTSTATE_REDIS_URL is not a valid URL")
    assert "scheme://host[:port][/path], with user:password@ before the host" in result.stderr
    assert "***" not in result.stderr


def test_a_bad_setting_stops_even_a_command_that_does_not_use_it(tmp_path: Path) -> None:
    env = {"AGENTSTATE_HOP_POLICY": "fast"}
    result = run(Settings(), "fsm", "diagram", env=env, cwd=tmp_path)
    assert_one_line_error(result, 2, "AGENTSTATE_HOP_POLICY")
    assert result.stdout == ""
    as_json = run(Settings(), "fsm", "diagram", "--json", env=env, cwd=tmp_path)
    assert as_json.returncode == 2
    error = json.loads(as_json.stdout)
    assert error["kind"] == "bad_input" and "AGENTSTATE_HOP_POLICY" in error["error"]


def test_an_empty_message_is_refused_before_any_database_is_made(tmp_path: Path) -> None:
    env = {"AGENTSTATE_DATABASE_URL": "sqlite:///agentstate.db"}  # the default, relative
    result = run(Settings(), "send", "s-1", " ", "--user", "alice", env=env, cwd=tmp_path)
    assert_one_line_error(result, 2, "message is empty")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def terminal(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    settings = agent_test_settings(pg_url)
    pool = Workers(settings, tmp_path_factory.mktemp("workers"), count=1, concurrency=2)
    pool.start()
    yield settings
    pool.stop()


@pytest.mark.workers
def test_send_wait_in_a_terminal_shows_a_streamed_reply_once(terminal: Settings) -> None:
    status, shown = in_terminal(
        terminal, "send", uid("s"), "trickle please", "--user", uid("u"), "--wait"
    )
    assert status == 0, shown
    assert shown.count("part 12") == 1, shown  # streamed in, not printed again
    # Piped, stdout carries the reply (the chunks went to the terminal on stderr).
    piped = run(terminal, "send", uid("s"), "trickle please", "--user", uid("u"), "--wait")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == " ".join(f"part {n}" for n in range(1, 13))


@pytest.mark.workers
def test_rows_fit_the_terminal_and_pipes_get_them_whole(terminal: Settings) -> None:
    user = uid("a-user-with-a-rather-long-name")
    client = AgentClient(terminal)
    long_ids = [uid("session-with-an-id-long-enough-to-push-the-columns-out") for _ in range(2)]
    for session_id in long_ids:
        client.send_message(session_id, "what is 1+1?", user_id=user)
    for session_id in long_ids:
        client.wait_for_idle(session_id, timeout=60)
    status, shown = in_terminal(terminal, "session", "list", "--user", user, columns=60)
    assert status == 0, shown
    rows = shown.strip("\n").splitlines()
    assert len(rows) == 3, shown
    assert all(len(row) <= 60 for row in rows), rows
    assert all(row.endswith(ELLIPSIS) for row in rows[1:]), rows
    piped = run(terminal, "session", "list", "--user", user)
    assert {line.split()[0] for line in piped.stdout.splitlines()[1:]} == set(long_ids)
