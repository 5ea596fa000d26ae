"""A worker on another "host" (a network namespace) is partitioned away mid-turn while
it holds the session's lock. Its lock expires, the sweep (beat) hands the turn to a
worker on this side, and when the partition heals the cut-off worker's late commit is
refused (StaleStateError in its log): exactly one reply."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import HopPolicy, Settings
from tasks.client import AgentClient
from tests.faults.helpers import fault_settings
from tests.netns import NetNamespace, Relay, endpoint
from tests.services import Beat
from tests.support import BROKER_URL, PG_SERVER, REDIS_URL, TEST_DB, Workers, uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.fixture
def netns() -> Iterator[NetNamespace]:
    made = NetNamespace.create_or_skip()
    yield made
    made.close()


@pytest.fixture
def relays(netns: NetNamespace) -> Iterator[dict[tuple[str, int], Relay]]:
    """One relay per service on the host side's veth address."""
    upstreams = {
        endpoint(PG_SERVER.replace("+psycopg2", ""), 5432),
        endpoint(REDIS_URL, 6379),
        endpoint(BROKER_URL, 6379),
    }
    made = {upstream: Relay(netns.host_addr, upstream) for upstream in upstreams}
    yield made
    for relay in made.values():
        relay.close()


def _remote(settings: Settings, relays: dict[tuple[str, int], Relay]) -> Settings:
    """The same settings as seen from the namespace: every service through its relay."""
    pg = relays[endpoint(PG_SERVER.replace("+psycopg2", ""), 5432)]
    return settings.model_copy(
        update={
            "database_url": f"{pg.rewrite(PG_SERVER)}/{TEST_DB}",
            "redis_url": relays[endpoint(REDIS_URL, 6379)].rewrite(settings.redis_url),
            "broker_url": relays[endpoint(BROKER_URL, 6379)].rewrite(settings.broker_url),
        }
    )


def _wait_for(condition: object, timeout: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_partitioned_lock_holder_is_overtaken_and_its_late_commit_refused(
    pg_url: str, netns: NetNamespace, relays: dict[tuple[str, int], Relay], tmp_path: Path
) -> None:
    # This side runs the reference agent; the far side the test agent, whose executing
    # handler straggles long enough for the partition, the sweep and the takeover.
    here = fault_settings(pg_url, HopPolicy.EVERY_PHASE, agent="tasks.agent")
    there = _remote(here.model_copy(update={"agent": "tests.agents"}), relays)
    (tmp_path / "there").mkdir()
    (tmp_path / "here").mkdir()
    far = Workers(there, tmp_path / "there", count=1, launcher=netns.launcher)
    near = Workers(here, tmp_path / "here", count=1)
    beat = Beat(here, tmp_path / "here")
    try:
        far.start()
        beat.start()
        client = AgentClient(here)
        session_id, user = uid("s"), uid("u")
        client.send_message(session_id, "straggle over 6*7", user_id=user)

        def executing() -> bool:
            snap = client.sessions.load_from_database(session_id)
            return snap is not None and snap.phase == "executing"

        _wait_for(executing, 30, "the far worker never started executing")
        time.sleep(0.3)  # inside the handler, holding the lock
        netns.cut()
        relay = next(iter(relays.values()))
        assert not netns.can_reach(relay.host, relay.port)  # a real partition
        near.start()  # the sweep hands the stuck phase to this worker
        doc = client.wait_for_idle(session_id, timeout=60)
        assert [m["content"] for m in doc["message_history"]] == ["straggle over 6*7", "6*7 = 42"]
        netns.heal()
        _wait_for(lambda: "StaleStateError" in far.logs(), 60, "the late commit was not refused")
        doc = client.get_session(session_id)
        assert doc is not None and doc["phase"] == "idle"
        assert [m["content"] for m in doc["message_history"]] == ["straggle over 6*7", "6*7 = 42"]
        assert "LockLostError, StaleStateError): session" in far.logs()
        assert "the state lock was lost before commit" in far.logs()
    finally:
        beat.stop()
        near.stop()
        far.stop()
