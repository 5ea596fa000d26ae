"""Human approval under faults: every worker SIGKILLed while the approved action runs.
The action may run again (an external side effect would repeat: pass the approval id to
the external system), but its changes apply once and the turn completes, once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from config import HopPolicy
from tests.agents import risky_key
from tests.faults.helpers import HOP_POLICIES, fault_settings, running
from tests.support import uid

pytestmark = [pytest.mark.faults, pytest.mark.workers]


@pytest.mark.parametrize("hop_policy", HOP_POLICIES)
def test_workers_killed_while_the_approved_action_runs(
    pg_url: str, tmp_path: Path, hop_policy: HopPolicy
) -> None:
    settings = fault_settings(pg_url, hop_policy)
    effects = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    with running(settings, tmp_path) as (client, pool):
        user, session_id = uid("u"), uid("s")
        client.send_message(session_id, "risky and linger", user_id=user)
        assert client.wait_for_idle(session_id, timeout=30)["phase"] == "awaiting_approval"
        (approval,) = client.approvals(user_id=user)
        client.decide(approval["approval_id"], True, by="ops")
        deadline = time.monotonic() + 20
        while not effects.get(risky_key(session_id)):  # the approved action is running
            assert time.monotonic() < deadline, "the approved action never started"
            time.sleep(0.02)
        for name in pool.alive():
            pool.kill(name)
        pool.add()
        pool.add()
        pool.wait_ready()
        doc = client.wait_for_idle(session_id, timeout=90)
        assert doc["phase"] == "idle"
        assistant = [m for m in doc["message_history"] if m["role"] == "assistant"]
        assert len(assistant) == 1 and assistant[0]["metadata"].get("kind") is None
        assert client.load_user_state(user)["risky_runs"] == 1  # applied once
        assert int(effects.get(risky_key(session_id)) or 0) >= 2  # it did run again
        assert client.approvals(user_id=user) == []
