"""Passwords with every special character work, and none reaches a log, a traceback or an
error line: a private Postgres with password (SCRAM) auth and a private Redis with an ACL
user and ``requirepass``, the real CLI and real workers.

Every password starts with a marker ("Zq7...") that survives percent-escaping, so
grepping for the marker finds the raw password, its escaped form and any leaked start.
"""

from __future__ import annotations

import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.services import PrivatePostgres, PrivateRedis
from tests.support import REPO, Workers, make_settings, settings_env, uid

AGENTSTATE = str(Path(sys.executable).with_name("agentstate"))
# Every printable special character, a space and a non-ASCII letter.
SPECIALS = string.punctuation + " é"
DB_PASSWORD = "Zq7Db" + SPECIALS
CACHE_PASSWORD = "Zq7Cache" + SPECIALS[::-1]
BROKER_PASSWORD = "Zq7Broker%41%" + SPECIALS  # "%41" must stay three characters
MARKERS = ("Zq7Db", "Zq7Cache", "Zq7Broker", "Zq7Wrong")
TIMEOUT_S = 120


def assert_no_secret(where: str, text: str) -> None:
    for marker in MARKERS:
        assert marker not in text, f"{where} holds a password:\n{text[-3000:]}"


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSTATE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


@pytest.fixture
def protected_pg(redis_url: str) -> Iterator[PrivatePostgres]:
    server = PrivatePostgres(host_auth="scram-sha-256").start()
    server.create_owner("agent", DB_PASSWORD, "agentstate")
    yield server
    server.close()


@pytest.fixture
def protected_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis().start()
    server.require_passwords(BROKER_PASSWORD, {"agent": CACHE_PASSWORD})
    yield server
    server.close()


@pytest.fixture
def secret_settings(protected_pg: PrivatePostgres, protected_redis: PrivateRedis) -> Settings:
    return make_settings(
        protected_pg.url_for("agent", DB_PASSWORD, "agentstate"),
        redis_url=protected_redis.url_for("agent", CACHE_PASSWORD, db=0),
        broker_url=protected_redis.url_for("", BROKER_PASSWORD, db=1),
        queue=uid("q"),
        # Workers and the client check the schema on first use (the Alembic path).
        auto_migrate=True,
    )


@pytest.mark.workers
def test_special_character_passwords_work_and_never_show(
    secret_settings: Settings,
    protected_pg: PrivatePostgres,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    env = settings_env(secret_settings)
    upgrade = run_cli(env, "db", "upgrade")
    assert upgrade.returncode == 0, upgrade.stderr
    assert "schema at revision" in upgrade.stdout
    assert_no_secret("agentstate db upgrade", upgrade.stdout + upgrade.stderr)

    wrong = run_cli(
        {**env, "AGENTSTATE_DATABASE_URL": protected_pg.url_for("agent", "Zq7Wrong#/@%", "x")},
        "db",
        "upgrade",
    )
    assert wrong.returncode == 1, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "password authentication failed" in wrong.stderr
    assert_no_secret("a failed login's error line", wrong.stdout + wrong.stderr)

    pool = Workers(secret_settings, tmp_path, count=1).start()
    try:
        client = AgentClient(secret_settings)
        session_id, user_id = uid("s"), uid("u")
        client.send_message(session_id, "what is 6*7?", user_id=user_id)
        doc = client.wait_for_idle(session_id, timeout=TIMEOUT_S)
        assert doc["message_history"][-1]["content"] == "6*7 = 42"
        workflow_id = client.start_workflow(
            {"steps": [{"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}}]}
        )
        assert client.wait_for_workflow(workflow_id, timeout=TIMEOUT_S)["status"] == "success"
    finally:
        pool.stop()
    for log in sorted(tmp_path.glob("*.log")):
        assert_no_secret(log.name, log.read_text(errors="replace"))
    assert_no_secret("the test process's log", caplog.text)
    assert_no_secret("the Postgres server log", protected_pg.log.read_text(errors="replace"))


MALFORMED = [
    ("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://agent:Zq7Db#x@127.0.0.1:5432/db"),
    ("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://agent:Zq7Db/x@127.0.0.1/db"),
    ("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://agent:Zq7Db@x@127.0.0.1/db"),
    ("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://agent:Zq7Db x@127.0.0.1/db"),
    ("AGENTSTATE_DATABASE_URL", "postgresql+psycopg2://agent:12/Zq7Db@127.0.0.1/db"),
    ("AGENTSTATE_REDIS_URL", "redis://:Zq7Cache/x@127.0.0.1:6379/0"),
    ("AGENTSTATE_REDIS_URL", "redis://:Zq7Cache#x@127.0.0.1:6379/0"),
    ("AGENTSTATE_REDIS_URL", "redis://agent:Zq7Cache%zz@127.0.0.1:6379/0"),
    ("AGENTSTATE_BROKER_URL", "redis://:Zq7Broker?x@127.0.0.1:6379/1"),
    ("AGENTSTATE_BROKER_URL", "redis://:Zq7Broker;x@127.0.0.1:6379/1"),
]


@pytest.mark.parametrize(("variable", "url"), MALFORMED)
def test_a_malformed_url_is_one_line_naming_its_variable(
    variable: str, url: str, tmp_path: Path
) -> None:
    env = settings_env(make_settings(f"sqlite:///{tmp_path / 'unused.db'}"))
    result = run_cli({**env, variable: url}, "db", "upgrade")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"agentstate: error: {variable} is not a valid")
    assert_no_secret("the error line", result.stderr)


@pytest.mark.workers
def test_a_worker_refuses_a_malformed_url_without_showing_it(tmp_path: Path) -> None:
    env = settings_env(make_settings(f"sqlite:///{tmp_path / 'unused.db'}"))
    env["AGENTSTATE_REDIS_URL"] = "redis://:Zq7Cache/x@127.0.0.1:6379/0"
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=solo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode != 0
    assert "AGENTSTATE_REDIS_URL is not a valid URL" in result.stderr
    assert_no_secret("the worker's output", result.stdout + result.stderr)
