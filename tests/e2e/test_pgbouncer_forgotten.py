"""PgBouncer in transaction mode with AGENTSTATE_DB_POOLER forgotten (a team that adds the
pooler later): the prepared statements' errors are unmistakable, so each process that
meets them switches to unprepared statements and says so once, naming the setting. Every
turn is answered and workflows finish; before, none was and none did."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from config import HopPolicy, Settings
from config.settings import DbPooler
from tasks.client import AgentClient
from tests.e2e.test_turns import (  # noqa: F401  (collected here again, through PgBouncer)
    test_sixty_messages_from_six_threads_to_one_session,
)
from tests.infra import PgBouncer
from tests.support import TEST_DB, Workers, make_settings, uid

pytestmark = pytest.mark.workers
WARNING = re.compile(r"prepared statements fail on .*AGENTSTATE_DB_POOLER is not set")


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[PgBouncer]:
    server = PgBouncer(pool_size=3).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def worker_settings(bouncer: PgBouncer) -> Settings:
    """Every connection through PgBouncer, and the pooler setting left at its default."""
    settings = make_settings(
        f"{bouncer.server}/{TEST_DB}",
        hop_policy=HopPolicy.INLINE,
        queue=uid("q"),
        stuck_after=30.0,
        retry_backoff=0.05,
    )
    assert settings.db_pooler == DbPooler.NONE
    return settings


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


def test_a_twenty_step_workflow_finishes(client: AgentClient) -> None:
    steps = [{"step_id": "s0", "action": "calculate", "inputs": {"expression": "1"}}]
    for n in range(1, 20):
        steps.append(
            {
                "step_id": f"s{n}",
                "action": "calculate",
                "inputs": {"expression": f"s{n - 1}+1"},
                "dependencies": [f"s{n - 1}"],
            }
        )
    doc = client.wait_for_workflow(client.start_workflow({"steps": steps}), timeout=120)
    assert doc["status"] == "success"
    assert doc["steps"]["s19"]["outputs"] == {"value": 20}


def test_each_worker_process_says_once_that_the_setting_is_missing(
    client: AgentClient, workers: Workers
) -> None:
    # After the turns and the workflow above (this module's tests run in order).
    session_id = uid("s")
    client.send_message(session_id, "what is 6*7?", user_id=uid("u"))
    assert client.wait_for_idle(session_id, timeout=60)["message_history"][-1]["content"] == (
        "6*7 = 42"
    )
    logs = "\n".join(path.read_text(errors="replace") for path in workers.log_dir.glob("*.log"))
    warnings = [line for line in logs.splitlines() if WARNING.search(line)]
    assert warnings, logs[-3000:]
    processes = workers.count * (1 + workers.concurrency)  # main processes and children
    assert len(warnings) <= processes, warnings
    assert "set AGENTSTATE_DB_POOLER=pgbouncer" in warnings[0]
    assert "Traceback" not in logs
