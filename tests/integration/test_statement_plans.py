"""The hot path's prepared statements find their rows by key under the plan Postgres
caches for them (the generic plan, used from a statement's sixth run on a connection):
a session's commit and a message's accept read the session row by its primary key, not
by a scan of its user's or its phase's sessions; the end of a turn, the start of the
next and an accept's check for an earlier waiting message read only the session's queued
messages, not every message it ever had, nor every session's queued ones; the sweep
finds waiting messages among the queued ones only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, insert

from state.recovery import queries
from state.sessions import inbox_postgres, store_postgres
from state.storage import prepared
from state.storage.backend import Backend
from state.storage.tables import inbox, sessions
from tests.support import PG_SERVER, TEST_DB, drop_database, make_settings, recreate_database

USER, PHASE, CROWD = "plan-user", "planning", 400
# Answered messages of each of the crowd's other sessions: an inbox that is almost all
# answered messages, as in use (a message waits only for moments), so that statistics
# taken from it say almost nothing is ever queued.
ANSWERED_EACH = 15


@pytest.fixture(scope="module", params=[False, True], ids=["stale-statistics", "analyzed"])
def crowded_db(pg_url: str, pg_template: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A database of its own where one user has many sessions in one phase, one session
    many answered messages and the others a few each, none queued, all committed: the
    plans depend on nothing earlier tests left behind. Analyzed, or never (autovacuum off,
    so the statistics stay the empty tables')."""
    name = f"{TEST_DB}_plans"
    recreate_database(name, template=pg_template)
    engine = Backend.build(make_settings(f"{PG_SERVER}/{name}")).engine
    with engine.begin() as conn:
        for table in ("sessions", "inbox"):
            conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        conn.execute(insert(sessions), _crowd_sessions())
        conn.execute(insert(inbox), _crowd_messages())
    if request.param:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE sessions")
            conn.exec_driver_sql("ANALYZE inbox")
    yield engine
    engine.dispose()
    drop_database(name)


def _crowd_sessions() -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "session_id": f"plan-{i:04d}",
            "user_id": USER,
            "phase": PHASE,
            "doc": "{}",
            "created_at": now,
            "updated_at": now,
        }
        for i in range(CROWD)
    ]


def _crowd_messages() -> list[dict[str, Any]]:
    """``CROWD`` answered messages of the first session, ``ANSWERED_EACH`` of the others',
    interleaved as sessions take turns in use (so the table is not in session order: the
    planner's costs depend on it)."""
    now = datetime.now(UTC)
    return [
        {
            "message_id": f"plan-msg-{i}-{seq}",
            "session_id": f"plan-{i:04d}",
            "seq": seq,
            "text": "old",
            "state": "answered",
            "created_at": now,
        }
        for seq in range(CROWD)
        for i in range(CROWD if seq < ANSWERED_EACH else 1)
    ]


@pytest.fixture
def crowded(crowded_db: Engine) -> Iterator[Connection]:
    """A connection to the crowded database, planning every statement generically."""
    with crowded_db.connect() as conn:
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        yield conn
        conn.rollback()


def _scans(plan: dict[str, Any], table: str) -> list[str]:
    """How each node of ``plan`` reading ``table`` reads it (its index, or its node type).

    A bitmap heap scan reads the table through the bitmap index scans under it: those
    indexes are what it reads by (the planner picks it or a plain index scan by cost,
    which a few rows more or less in the table can tip either way)."""
    found = []
    if plan.get("Relation Name") == table and "Scan" in plan["Node Type"]:
        if plan["Node Type"] == "Bitmap Heap Scan":
            found.extend(_bitmap_indexes(plan) or [plan["Node Type"]])
        else:
            found.append(plan.get("Index Name") or plan["Node Type"])
    for child in plan.get("Plans", []):
        found.extend(_scans(child, table))
    return found


def _bitmap_indexes(plan: dict[str, Any]) -> list[str]:
    """The indexes the bitmap index scans under ``plan`` read (through BitmapAnd/Or)."""
    found = []
    for child in plan.get("Plans", []):
        if child["Node Type"] == "Bitmap Index Scan":
            found.append(child["Index Name"])
        else:
            found.extend(_bitmap_indexes(child))
    return found


def _generic_plan(conn: Connection, statement: prepared.Prepared) -> dict[str, Any]:
    """The generic plan of ``statement`` (every parameter NULL: the plan ignores them)."""
    conn.exec_driver_sql(f"PREPARE plan_probe AS {statement.sql}")
    try:
        nulls = ", ".join(["NULL"] * len(statement.params))
        found = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe({nulls})")
        plan: dict[str, Any] = found.scalar_one()[0]["Plan"]
        return plan
    finally:
        conn.exec_driver_sql("DEALLOCATE plan_probe")


@pytest.mark.parametrize(
    "statement",
    [
        store_postgres.statement(0, 0, True),
        store_postgres.statement(1, 1, True, reports=True),
        store_postgres.statement(0, 0, True, strict=True),
        store_postgres.statement(0, 0),
        inbox_postgres._ACCEPT,
        inbox_postgres._ACCEPTED,
    ],
    ids=["bound", "bound-ending-turn", "bound-staged", "unbound", "accept", "accepted"],
)
def test_a_session_row_is_found_by_its_key(crowded: Connection, statement: Any) -> None:
    scans = _scans(_generic_plan(crowded, statement), "sessions")
    assert scans and set(scans) == {"sessions_pkey"}, scans


@pytest.mark.parametrize(
    "statement",
    [store_postgres._APPLIED_AND_QUEUED, inbox_postgres._NEXT],
    ids=["queued-after-commit", "next-queued"],
)
def test_only_the_sessions_queued_messages_are_read(crowded: Connection, statement: Any) -> None:
    scans = _scans(_generic_plan(crowded, statement), "inbox")
    assert scans and set(scans) == {"ix_inbox_session_queued"}, scans


def test_an_accept_counts_the_sessions_and_the_users_queued_messages(crowded: Connection) -> None:
    """AGENTSTATE_MAX_QUEUED_MESSAGES counts the session's queued messages, and
    AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER the user's, through the partial indexes of
    queued messages: never a scan of answered messages (with few queued messages in all,
    the planner may count the user's through the sessions' index)."""
    scans = _scans(_generic_plan(crowded, inbox_postgres._ACCEPTED), "inbox")
    assert len(scans) == 2, scans
    assert set(scans) <= {"ix_inbox_session_queued", "ix_inbox_user_queued"}, scans


def test_the_sweep_finds_waiting_messages_by_the_queued_index(crowded: Connection) -> None:
    """The sweep's look for resting sessions with a message waiting reads only queued
    messages, whatever the plan's shape (a semi-join over them, or one session's each)."""
    query = queries.waiting_in_inbox_query(datetime.now(UTC), 100)
    sql = query.compile(crowded, compile_kwargs={"literal_binds": True})
    found = crowded.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}").scalar_one()[0]["Plan"]
    scans = _scans(found, "inbox")
    # Either partial index holds only the queued messages (the user's one may look cheaper
    # on stale statistics): never the answered ones.
    assert scans and set(scans) <= {"ix_inbox_session_queued", "ix_inbox_user_queued"}, scans
