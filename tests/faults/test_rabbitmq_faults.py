"""The worker-kill fault test again, on RabbitMQ (a quorum queue): whole workers killed
three times mid-run lose and double nothing. A killed worker's unacknowledged messages
go back to the queue when RabbitMQ sees its connection close."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import HopPolicy, Settings
from tests.faults.helpers import fault_settings as make_fault_settings
from tests.faults.test_worker_faults import (  # noqa: F401  (collected here again)
    beat,
    test_sigkill_whole_workers_three_times_loses_and_doubles_nothing,
)
from tests.infra import RabbitVhost

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture(scope="module")
def rabbit() -> RabbitVhost:
    return RabbitVhost().ensure()


@pytest.fixture
def fault_settings(pg_url: str, rabbit: RabbitVhost) -> Iterator[Settings]:
    settings = make_fault_settings(pg_url, HopPolicy.EVERY_PHASE, broker_url=rabbit.url)
    yield settings
    rabbit.delete_queue(settings.queue)
