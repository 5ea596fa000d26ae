"""Each module of these tests runs the test agent on two workers of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.support import Workers, agent_test_settings


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


@pytest.fixture(scope="module")
def client(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentClient]:
    pool = Workers(settings, tmp_path_factory.mktemp("lifecycle"), count=2).start()
    yield AgentClient(settings)
    pool.stop()
