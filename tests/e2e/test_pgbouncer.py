"""Turns and workflows through PgBouncer in transaction mode, with the fast path on.

Behind a transaction-mode pooler a client's next statement may run on another server
connection. The prepared one-statement commits then failed ("prepared statement ... does
not exist" / "already exists") and turns stuck; with ``AGENTSTATE_DB_POOLER=pgbouncer``
the same statements go unprepared. The key turn and workflow tests of test_turns.py and
test_workflows.py run here again, on workers whose every connection goes through
PgBouncer (a pool of three server connections, so that they are shared all the time).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import HopPolicy, Settings
from config.settings import DbPooler
from tasks.client import AgentClient
from tests.e2e.test_turns import (  # noqa: F401  (collected here again, through PgBouncer)
    test_multi_part_question_is_answered_through_a_workflow,
    test_sixty_messages_from_six_threads_to_one_session,
    test_twenty_sessions_three_questions_each,
)
from tests.e2e.test_workflows import (  # noqa: F401
    effects,
    test_a_step_failing_twice_then_succeeding,
    test_diamond_computes_through_dependency_outputs,
    test_forty_wide_fan_out_and_fan_in,
)
from tests.infra import PgBouncer
from tests.support import TEST_DB, Workers, make_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[PgBouncer]:
    server = PgBouncer(pool_size=3).start()
    print(f"\n{server.version()} in transaction mode on port {server.port}")
    yield server
    server.close()


@pytest.fixture(scope="module")
def worker_settings(bouncer: PgBouncer) -> Settings:
    """Workers and clients reach Postgres only through PgBouncer, on the inline fast path."""
    return make_settings(
        f"{bouncer.server}/{TEST_DB}",
        db_pooler=DbPooler.PGBOUNCER,
        hop_policy=HopPolicy.INLINE,
        queue=uid("q"),
        stuck_after=30.0,
        retry_backoff=0.05,
        action_modules="tests.actions_for_tests",
    )


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


def _transactions(bouncer: PgBouncer) -> int:
    rows = bouncer.admin("SHOW STATS")
    # database, total_xact_count, ... (the column order of PgBouncer's SHOW STATS)
    return sum(int(str(row[1])) for row in rows if row[0] != "pgbouncer")


def test_turns_go_through_pgbouncer_without_prepared_statement_errors(
    client: AgentClient, bouncer: PgBouncer, workers: Workers
) -> None:
    before = _transactions(bouncer)
    user, sessions = uid("u"), [uid("s") for _ in range(8)]
    for session_id in sessions:
        for n in range(3):
            client.send_message(session_id, f"what is {n}+40?", user_id=user)
    for session_id in sessions:
        history = client.wait_for_idle(session_id, timeout=60)["message_history"]
        assert [m["content"] for m in history[1::2]] == [f"{n}+40 = {n + 40}" for n in range(3)]
    assert _transactions(bouncer) - before >= 24 * 2  # the turns' commits went through it
    logs = workers.logs()
    assert "prepared statement" not in logs, logs[-3000:]
