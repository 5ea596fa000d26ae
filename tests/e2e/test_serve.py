"""``agentstate serve`` as an operator runs it: its help, what it refuses at start, its
limits on streams and requests, readiness, keys from a file, and a clean stop on
SIGTERM and SIGINT with streams open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from config import Settings
from tasks.worker.processes import ApiServer, free_port
from tests.api_support import keys_value, new_keys, read, sse_messages
from tests.support import REPO, make_settings, settings_env, uid

STOP_WITHIN_S = 30.0  # a bound on waiting, not a timing assertion


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )


@pytest.fixture
def settings(pg_url: str) -> Settings:
    return make_settings(pg_url)


def test_help_explains_keys_and_loopback() -> None:
    result = cli("serve", "--help")
    assert result.returncode == 0
    for words in ("AGENTSTATE_API_KEYS", "Bearer", "loopback", "--host", "--port", "/openapi.json"):
        assert words in result.stdout


def test_a_public_address_without_keys_is_refused_in_one_line(settings: Settings) -> None:
    env = settings_env(settings)
    env.pop("AGENTSTATE_API_KEYS", None)
    for host in ("0.0.0.0", "192.0.2.10", "example.com"):
        result = cli("serve", "--host", host, "--port", str(free_port()), env=env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "AGENTSTATE_API_KEYS" in lines[0], result.stderr


def test_a_port_in_use_is_refused_in_one_line(settings: Settings) -> None:
    """As every other start error: one line, exit 2, no banner first; with --json the
    error document on stdout."""
    import json
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = cli("serve", "--port", port, env=settings_env(settings))
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in lines[0]
        as_json = cli("serve", "--port", port, "--json", env=settings_env(settings))
    assert as_json.returncode == 2, as_json.stderr
    error = json.loads(as_json.stdout)
    assert error["kind"] == "bad_input" and "the port is in use" in error["error"]


def test_bad_keys_are_refused_in_one_line_naming_the_variable(settings: Settings) -> None:
    env = {**settings_env(settings), "AGENTSTATE_API_KEYS": "secret-without-user"}
    result = cli("serve", "--port", str(free_port()), env=env)
    assert result.returncode == 2
    assert "AGENTSTATE_API_KEYS" in result.stderr and "secret-without-user" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_the_server_extra_it_says_how_to_install_it(
    settings: Settings, tmp_path: Path
) -> None:
    # A fastapi that cannot be imported stands for one that is not installed.
    (tmp_path / "fastapi").mkdir()
    (tmp_path / "fastapi" / "__init__.py").write_text("raise ImportError('no fastapi here')\n")
    env = settings_env(settings)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    result = cli("serve", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "agentstate: error: agentstate serve needs the server extra (fastapi is missing): "
        "pip install 'agentstate[server]'"
    ]


def start(settings: Settings, tmp_path: Path, **env: str) -> tuple[ApiServer, Path]:
    environment = {**settings_env(settings), **env}
    log = tmp_path / "serve.log"
    server = ApiServer(settings, free_port(), log=log, env=environment)
    assert server.wait_ready(90), read(log)
    return server, log


def stopped_by(server: ApiServer, sig: int) -> int:
    os.kill(server.proc.pid, sig)
    return server.proc.wait(timeout=STOP_WITHIN_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_cleanly_with_streams_open(
    settings: Settings, tmp_path: Path, sig: int
) -> None:
    server, log = start(settings, tmp_path)
    session_id = uid("sig")
    client = httpx.Client(base_url=server.url, timeout=30)
    sent = client.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi", "user_id": "u"})
    assert sent.status_code == 202
    ended: list[str] = []

    def hold() -> None:
        with client.stream("GET", f"/v1/sessions/{session_id}/events") as stream:
            ended.extend(m.data["kind"] for m in sse_messages(stream) if m.data)

    holders = [threading.Thread(target=hold) for _ in range(3)]
    for holder in holders:
        holder.start()
    time.sleep(1.0)  # the streams are open and past their first event
    assert stopped_by(server, sig) == 0, read(log)
    for holder in holders:
        holder.join(STOP_WITHIN_S)
        assert not holder.is_alive(), "a stream outlived the server"
    assert ended.count("message_accepted") == 3
    assert "Traceback" not in read(log)


def test_streams_beat_end_and_are_limited(settings: Settings, tmp_path: Path) -> None:
    server, log = start(
        settings,
        tmp_path,
        AGENTSTATE_STREAM_HEARTBEAT="0.2",
        AGENTSTATE_STREAM_MAX_SECONDS="2",
        AGENTSTATE_MAX_STREAMS="1",
    )
    try:
        session_id = uid("beat")
        client = httpx.Client(base_url=server.url, timeout=30)
        client.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi", "user_id": "u"})
        path = f"/v1/sessions/{session_id}/events"
        with client.stream("GET", path) as first:
            crowded = client.get(path)
            assert crowded.status_code == 503 and "AGENTSTATE_MAX_STREAMS" in crowded.text
            assert crowded.headers["retry-after"]
            messages = list(sse_messages(first))  # ends by itself after 2 s
        assert any(m.comment == "heartbeat" for m in messages)
        assert any(m.data and m.data["kind"] == "message_accepted" for m in messages)
        # The slot is free again once a stream ends.
        with client.stream("GET", path, params={"timeout": 0.5}) as again:
            assert again.status_code == 200
            again.read()
    finally:
        assert server.stop() == 0, read(log)


def test_a_handler_past_its_time_limit_answers_503(settings: Settings, tmp_path: Path) -> None:
    server, log = start(settings, tmp_path, AGENTSTATE_REQUEST_TIME_LIMIT="0.000001")
    try:
        answer = httpx.get(f"{server.url}/v1/sessions", timeout=30)
        assert answer.status_code == 503, answer.text
        assert answer.json()["kind"] == "timeout"
        assert "AGENTSTATE_REQUEST_TIME_LIMIT" in answer.json()["error"]
    finally:
        assert server.stop() == 0, read(log)


def test_keys_from_a_file_and_readiness_without_redis(pg_url: str, tmp_path: Path) -> None:
    keys = new_keys("alice", "*")
    secret = tmp_path / "api_keys"
    secret.write_text(keys_value(keys).replace(",", "\n") + "\n")
    # Nothing listens on this port: Redis is down for this server.
    down = make_settings(pg_url, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    server, log = start(down, tmp_path, AGENTSTATE_API_KEYS_FILE=str(secret))
    try:
        alice = {"Authorization": f"Bearer {keys['alice']}"}
        me = httpx.get(f"{server.url}/v1/me", headers=alice, timeout=30)
        assert me.json() == {"user_id": "alice", "operator": False}
        assert httpx.get(f"{server.url}/v1/me", timeout=30).status_code == 401
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"] == "ok"
        assert ready.json()["checks"]["redis"] != "ok"
    finally:
        assert server.stop() == 0, read(log)
    for key in keys.values():
        assert key not in read(log)
