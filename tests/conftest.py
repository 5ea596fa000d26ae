"""Fixtures: real Redis and Postgres (their own DB indexes and database), real workers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine

from config import Settings
from state.storage.backend import reset_backends
from state.storage.db import dispose_engines, get_engine, upgrade_schema
from state.storage.redis_client import forget_clients
from tasks.worker import processes
from tests import scheduling
from tests.services import PrivateRedis
from tests.support import (
    BROKER_URL,
    PG_SERVER,
    PG_URL,
    REDIS_URL,
    TEMPLATE_DB,
    TEST_DB,
    XDIST_WORKER,
    Workers,
    drop_database,
    make_settings,
    postgres_ok,
    recreate_database,
    redis_ok,
    uid,
    unavailable,
)

# The code under test must never pick up a developer's AGENTSTATE_* environment.
for _name in [k for k in os.environ if k.startswith("AGENTSTATE_") and "_TEST_" not in k]:
    del os.environ[_name]
os.environ["AGENTSTATE_REDIS_URL"] = REDIS_URL
os.environ["AGENTSTATE_BROKER_URL"] = BROKER_URL


def pytest_configure(config: pytest.Config) -> None:
    # Workers run in process groups of their own, out of reach of the terminal's Ctrl-C:
    # a run ended by SIGTERM (CI, a timeout) tears down like one ended by Ctrl-C.
    processes.exit_on_sigterm()
    # Under xdist the modules go out in the order pytest_collection_modifyitems gives
    # them (slowest first), not re-sorted by their number of tests.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not XDIST_WORKER:  # the one run's controller (or its only process)
        scheduling.install_missing_in_background()


@pytest.hookimpl(tryfirst=True)  # before -m deselects: `-m "not slow"` sees the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scheduling.order_and_mark(items, slowest_first=bool(XDIST_WORKER))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # After every fixture's teardown, even an interrupted run's: whatever a test started
    # and left running (it raised before its own stop) is stopped now.
    processes.stop_all()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if not redis_ok(REDIS_URL) or not redis_ok(BROKER_URL):
        unavailable("Redis at 127.0.0.1:6379")
    for url in (REDIS_URL, BROKER_URL):
        redis.Redis.from_url(url).flushdb()
    yield REDIS_URL
    for url in (REDIS_URL, BROKER_URL):
        redis.Redis.from_url(url).flushdb()


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A database at the current schema that nobody connects to, for CREATE DATABASE to
    copy (tests.support.TEMPLATE_DB)."""
    if not postgres_ok():
        unavailable("PostgreSQL at 127.0.0.1:5432")
    recreate_database(TEMPLATE_DB)
    engine = create_engine(f"{PG_SERVER}/{TEMPLATE_DB}")
    upgrade_schema(engine)
    engine.dispose()  # a template with a connection open cannot be copied
    yield TEMPLATE_DB
    drop_database(TEMPLATE_DB)


@pytest.fixture(scope="session")
def pg_url(redis_url: str, pg_template: str) -> Iterator[str]:
    recreate_database(TEST_DB, template=pg_template)
    yield PG_URL
    dispose_engines()
    drop_database(TEST_DB)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once per test process; each test gets a copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "agentstate.db"
    engine = get_engine(f"sqlite:///{path}")
    upgrade_schema(engine)
    engine.dispose()  # the last connection closed: the WAL is folded into the file
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, redis_url: str, sqlite_template: Path) -> str:
    path = tmp_path / "agentstate.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each backend contract test runs on Postgres and on SQLite."""
    return str(request.getfixturevalue("pg_url" if request.param == "postgres" else "sqlite_url"))


@pytest.fixture
def settings(db_url: str) -> Settings:
    return make_settings(db_url)


@pytest.fixture
def pg_settings(pg_url: str) -> Settings:
    return make_settings(pg_url)


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    yield
    reset_backends()
    forget_clients()


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    """Settings shared by a module's workers and its clients (own queue per module)."""
    return make_settings(
        pg_url,
        queue=uid("q"),
        stuck_after=30.0,
        retry_backoff=0.05,
        action_modules="tests.actions_for_tests",
    )


@pytest.fixture(scope="module")
def workers(
    worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    pool = Workers(worker_settings, tmp_path_factory.mktemp("workers"), count=2).start()
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server of the module's own (cache, locks, pushes), so that FLUSHALL in its
    tests touches nothing else."""
    server = PrivateRedis().start()
    yield server
    server.close()
