"""``postgres://...``, the URL most hosted Postgres hands out, works wherever a database
URL is read: the settings, the engines, the command line."""

from __future__ import annotations

import json
import subprocess
import sys

from config import child_environment
from tasks.client import AgentClient
from tests.support import make_settings, uid


def _hosted_form(pg_url: str) -> str:
    return pg_url.replace("postgresql+psycopg2://", "postgres://", 1)


def test_a_postgres_url_reaches_the_database(pg_url: str) -> None:
    url = _hosted_form(pg_url)
    assert url.startswith("postgres://")
    client = AgentClient(make_settings(url))
    user = uid("u")
    client.save_user_state(user, {"hosted": True})
    assert AgentClient(make_settings(pg_url)).load_user_state(user)["hosted"] is True


def test_the_cli_accepts_a_postgres_url(pg_url: str) -> None:
    env = child_environment(make_settings(pg_url))
    env["AGENTSTATE_DATABASE_URL"] = _hosted_form(pg_url)
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "db", "upgrade", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["revision"]
