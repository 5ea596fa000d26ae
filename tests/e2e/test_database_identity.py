"""An app and its workers on different databases (the default SQLite file, relative to the
folders they started in) is told, not silent: the worker's banner shows the absolute path,
workers publish which database they use, and a client on the same queue that uses another
warns once. One Postgres database reads as one, whatever URL reaches it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from state.storage.db import get_engine, upgrade_schema
from state.storage.identity import database_identity
from tasks.client import AgentClient
from tests.support import PG_SERVER, TEST_DB, Workers, make_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def worker_db(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('workers') / 'agentstate.db'}"
    upgrade_schema(get_engine(url))
    return url


@pytest.fixture(scope="module")
def sqlite_workers(
    worker_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, Workers]]:
    settings = make_settings(worker_db, queue=uid("q"))
    pool = Workers(settings, tmp_path_factory.mktemp("logs"), count=1).start()
    yield settings, pool
    pool.stop()


def test_the_worker_banner_shows_the_absolute_database_path(
    sqlite_workers: tuple[Settings, Workers], worker_db: str
) -> None:
    _, pool = sqlite_workers
    assert f".> database:  {worker_db}" in pool.logs()
    assert worker_db.startswith("sqlite:////")


def test_a_client_on_another_database_warns_once(
    sqlite_workers: tuple[Settings, Workers],
    sqlite_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, _ = sqlite_workers
    elsewhere = AgentClient(make_settings(sqlite_url, queue=settings.queue))
    with caplog.at_level(logging.WARNING, logger="state.storage.identity"):
        elsewhere.send_message(uid("s"), "hello", user_id=uid("u"))
        elsewhere.send_message(uid("s"), "hello again", user_id=uid("u"))
    warnings = [r.getMessage() for r in caplog.records if "workers on queue" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert sqlite_url in warnings[0] and "AGENTSTATE_DATABASE_URL" in warnings[0]


def test_a_client_on_the_workers_database_does_not_warn(
    sqlite_workers: tuple[Settings, Workers], caplog: pytest.LogCaptureFixture
) -> None:
    settings, _ = sqlite_workers
    client = AgentClient(settings)
    with caplog.at_level(logging.WARNING, logger="state.storage.identity"):
        session_id = uid("s")
        client.send_message(session_id, "what is 2+2?", user_id=uid("u"))
        assert client.wait_for_idle(session_id, timeout=30)["message_history"][-1]["content"]
    assert not [r for r in caplog.records if "workers on queue" in r.getMessage()]


def test_one_postgres_database_reads_as_one_whatever_url_reaches_it(pg_url: str) -> None:
    by_address = database_identity(get_engine(f"{PG_SERVER}/{TEST_DB}"))
    by_name = database_identity(
        get_engine(f"{PG_SERVER.replace('127.0.0.1', 'localhost')}/{TEST_DB}")
    )
    other = database_identity(get_engine(f"{PG_SERVER}/postgres"))
    assert by_address is not None and by_address == by_name
    assert other is not None and other != by_address and by_address.endswith(f"/{TEST_DB}")


def test_sqlite_files_read_by_their_absolute_path(tmp_path: Path) -> None:
    assert database_identity(get_engine(f"sqlite:///{tmp_path}/a.db")) == f"sqlite:{tmp_path}/a.db"
    assert database_identity(get_engine("sqlite:///:memory:")) is None
