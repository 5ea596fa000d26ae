"""The hot path's prepared statements find their rows by key under the plan Postgres
caches for them (the generic plan, used from a statement's sixth run on a connection):
a session's commit and a message's accept read the session row by its primary key, not
by a scan of its user's or its phase's sessions; the end of a turn, the start of the
next and an accept's check for an earlier waiting message read only the session's queued
messages, not every message it ever had."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, insert

from config import Settings
from state.sessions import inbox_postgres, store_postgres
from state.storage import prepared
from state.storage.backend import Backend
from state.storage.tables import inbox, sessions

USER, PHASE, CROWD = "plan-user", "planning", 400


@pytest.fixture(params=[False, True], ids=["stale-statistics", "analyzed"])
def crowded(pg_settings: Settings, request: pytest.FixtureRequest) -> Iterator[Connection]:
    """A connection in a transaction (undone after the test) where one user has many
    sessions in one phase and one session has many answered messages; the tables
    analyzed, or not (the statistics the plans are made from are the older ones)."""
    engine = Backend.build(pg_settings).engine
    now = datetime.now(UTC)
    with engine.connect() as conn:
        conn.execute(
            insert(sessions),
            [
                {
                    "session_id": f"plan-{i:04d}",
                    "user_id": USER,
                    "phase": PHASE,
                    "doc": "{}",
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(CROWD)
            ],
        )
        conn.execute(
            insert(inbox),
            [
                {
                    "message_id": f"plan-msg-{i}",
                    "session_id": "plan-0000",
                    "seq": i,
                    "text": "old",
                    "state": "answered",
                    "created_at": now,
                }
                for i in range(CROWD)
            ],
        )
        if request.param:
            conn.exec_driver_sql("ANALYZE sessions")
            conn.exec_driver_sql("ANALYZE inbox")
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
    [store_postgres._APPLIED_AND_QUEUED, inbox_postgres._NEXT, inbox_postgres._ACCEPTED],
    ids=["queued-after-commit", "next-queued", "queued-before-accepted"],
)
def test_only_the_sessions_queued_messages_are_read(crowded: Connection, statement: Any) -> None:
    scans = _scans(_generic_plan(crowded, statement), "inbox")
    assert scans and set(scans) == {"ix_inbox_session_queued"}, scans
