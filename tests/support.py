"""Test helpers: service endpoints, settings, unique ids and real worker processes."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text

from config import Settings, child_environment
from config.urls import normalise_database_url
from tasks.worker import processes

REPO = Path(__file__).resolve().parents[1]
IN_CI = bool(os.environ.get("CI"))
# Under pytest-xdist (`make test` runs two processes) each process has a database, Redis
# indexes and a RabbitMQ vhost of its own: "gw0" the configured ones, "gw1" its own.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_NUMBER = int(XDIST_WORKER[2:]) if XDIST_WORKER[2:].isdigit() else 0
REDIS_INDEXES_PER_WORKER = 4


def per_worker(name: str) -> str:
    """``name`` for this test process (a database, a vhost): its own under xdist."""
    return f"{name}_{XDIST_WORKER}" if _WORKER_NUMBER else name


def per_worker_redis(url: str) -> str:
    """``url`` (ending in a DB index) at this test process's own index under xdist."""
    base, _, index = url.rpartition("/")
    if not _WORKER_NUMBER or not index.isdigit():
        return url
    return f"{base}/{(int(index) - REDIS_INDEXES_PER_WORKER * _WORKER_NUMBER) % 16}"


TEST_DB = per_worker(os.environ.get("AGENTSTATE_TEST_DB_NAME", "agentstate_test"))
PG_SERVER = normalise_database_url(
    os.environ.get("AGENTSTATE_TEST_PG_SERVER", "postgresql+psycopg2://postgres@127.0.0.1:5432")
)
PG_URL = f"{PG_SERVER}/{TEST_DB}"
# Migrated once per test process (the pg_template fixture); the test database and the
# modules' own databases are copies of it (CREATE DATABASE ... TEMPLATE: 0.2 s, where
# running the migrations takes 3 s).
TEMPLATE_DB = f"{TEST_DB}_template"
REDIS_URL = per_worker_redis(
    os.environ.get("AGENTSTATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
)
BROKER_URL = per_worker_redis(
    os.environ.get("AGENTSTATE_TEST_BROKER_URL", "redis://127.0.0.1:6379/14")
)
WORKER_START_TIMEOUT_S = 60.0


def unavailable(what: str) -> None:
    """Skip locally when a service is missing; fail in CI (CI must test everything)."""
    if IN_CI:
        pytest.fail(f"{what} is not reachable, and CI requires it")
    pytest.skip(f"{what} is not reachable")


def redis_ok(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def postgres_ok() -> bool:
    try:
        engine = create_engine(f"{PG_SERVER}/postgres")
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


def recreate_database(name: str, template: str | None = None) -> None:
    """An empty database ``name``, or a copy of ``template`` (which nobody may be
    connected to: see :data:`TEMPLATE_DB`)."""
    copy = f' TEMPLATE "{template}"' if template else ""
    engine = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    engine.dispose()


def drop_database(name: str) -> None:
    engine = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def uid(prefix: str = "t") -> str:
    """A fresh id for one test's sessions, users and workflows."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for tests: their own Redis DB indexes and database."""
    values: dict[str, Any] = {
        "redis_url": REDIS_URL,
        "broker_url": BROKER_URL,
        "database_url": database_url,
        "auto_migrate": False,
        "baseline_tasks": True,
        # Tests decide when periodic work runs (a Beat of their own, or a direct call);
        # tests/faults/test_house_beat.py runs the workers' own.
        "worker_beat": False,
    }
    values.update(overrides)
    return Settings(**values)


def agent_test_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for a module that runs the test agent and actions on workers of its own
    (a queue of its own, quick step retries, no sweep interference)."""
    values: dict[str, Any] = {
        "queue": uid("q"),
        "agent": "tests.agents",
        "action_modules": "tests.actions_for_tests",
        "retry_backoff": 0.05,
        "stuck_after": 30.0,
    }
    values.update(overrides)
    return make_settings(database_url, **values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The AGENTSTATE_* environment that reproduces ``settings`` in a subprocess."""
    env = child_environment(settings)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class Workers(processes.WorkerGroup):
    """Real ``celery -A tasks worker`` processes for one test (or module)."""

    def __init__(self, settings: Settings, log_dir: Path, **options: Any) -> None:
        super().__init__(settings, log_dir, cwd=REPO, **options)
        self.env = settings_env(settings)

    def children(self, name: str) -> list[int]:
        """PIDs of a worker's pool processes."""
        return self.children_of(self.procs[name].pid)
