"""Redis behind Sentinel: the primary is SIGKILLed mid-run and a replica takes over.

Locks, cache and broker all live in the Sentinel-managed Redis
(``redis+sentinel://`` for AGENTSTATE_REDIS_URL and AGENTSTATE_BROKER_URL). Whatever the
old primary had not replicated is gone: locks (which only save work), cache entries and
queued messages. Postgres is the authority and the sweep re-enqueues lost work, so every
message is still answered exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import HopPolicy, Settings
from tests.faults.helpers import (
    assert_answered_exactly_once,
    fault_settings,
    running,
    wait_all_idle,
)
from tests.infra import SentinelCluster
from tests.support import uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture
def cluster() -> Iterator[SentinelCluster]:
    started = SentinelCluster().start()
    yield started
    started.close()


@pytest.fixture
def sentinel_settings(pg_url: str, cluster: SentinelCluster) -> Settings:
    return fault_settings(
        pg_url, HopPolicy.EVERY_PHASE, redis_url=cluster.url(0), broker_url=cluster.url(1)
    )


def test_a_sentinel_failover_mid_run_loses_and_doubles_nothing(
    sentinel_settings: Settings, cluster: SentinelCluster, tmp_path: Path
) -> None:
    user, sessions = uid("u"), [uid("s") for _ in range(20)]
    sent: dict[str, list[str]] = {s: [] for s in sessions}
    with running(sentinel_settings, tmp_path) as (client, pool):
        for wave in range(3):
            for i, session_id in enumerate(sessions):
                text = f"what is {wave + 3}*{i + 20}?"
                client.send_message(session_id, text, user_id=user)
                sent[session_id].append(text)
            if wave == 0:
                time.sleep(0.3)  # turns are in flight
                cluster.kill_primary()
                cluster.wait_for_primary(cluster.replica_port)  # the replica is promoted
        wait_all_idle(client, sessions, timeout=120)
        assert assert_answered_exactly_once(client, sent) == 60
        assert pool.alive() == list(pool.procs)  # the workers rode through it
