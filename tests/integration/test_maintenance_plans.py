"""Maintenance costs what it does, not what the database holds (issue #47): on a
database of its own, seeded with thousands of rows shaped like real ones, the plans of
the revision prune, the recovery sweep, a deep page and erasure's batches read through
an index and drop (by filter) at most a few rows per row they return, at depth, after a
prune and with nothing due. Plans, not times: ``EXPLAIN (ANALYZE)`` counts rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select

from state import paging
from state.events import retention
from state.events.retention import events_batch, old_events
from state.lifecycle.erase import Walk
from state.recovery import queries
from state.sessions.listing import list_sessions
from state.storage.backend import Backend
from state.storage.db import upgrade_schema
from state.storage.tables import revisions, sessions
from tests.support import PG_SERVER, TEST_DB, drop_database, make_settings, recreate_database

CROWD = 4000  # sessions, one in ten of them ERASED's
ERASED = "m-erased"
HISTORIED = 400  # sessions with revision records
REVISIONS = 80  # each; the first 70 older than the retention cutoff
OLD_REVISIONS = 70
EVENTS = 60  # each of the HISTORIED sessions'; the first 50 older than the cutoff
OLD_EVENTS = 50
STUCK = 12  # sessions mid-turn, untouched for long
APPROVAL_STEPS = 3000  # waiting for a decision, untouched for long
FORGOTTEN_STEPS = 8  # ready, untouched for long: the sweep's to find
NOW = datetime.now(UTC)
CUTOFF = NOW - timedelta(days=30)
SWEEP_CUTOFF = NOW - timedelta(minutes=1)

_SEED = f"""
INSERT INTO sessions (session_id, user_id, phase, status, revision, doc, created_at, updated_at)
SELECT 'm-' || lpad(i::text, 5, '0'),
       CASE WHEN mod(i, 10) = 0 THEN '{ERASED}' ELSE 'm-user-' || mod(i, 37) END,
       CASE WHEN i < {STUCK} THEN 'executing'
            WHEN mod(i, 20) = 1 THEN 'awaiting_approval'
            WHEN mod(i, 50) = 3 THEN 'generating'
            ELSE 'idle' END,
       'active', {REVISIONS}, '{{}}',
       TIMESTAMPTZ '2026-01-01' + i * INTERVAL '1 second',
       CASE WHEN mod(i, 50) = 3 AND i >= {STUCK} THEN now() ELSE now() - INTERVAL '2 hours' END
FROM generate_series(0, {CROWD - 1}) AS i;

INSERT INTO revisions (session_id, revision, phase, status, at, message_count, event_seq,
                       doc, patch)
SELECT 'm-' || lpad(s::text, 5, '0'), r, 'idle', 'active',
       CASE WHEN r <= {OLD_REVISIONS}
            THEN now() - INTERVAL '40 days' + (r * {HISTORIED} + s) * INTERVAL '1 second'
            ELSE now() - INTERVAL '1 hour' END,
       0, 0,
       CASE WHEN r = 1 OR mod(r, 32) = 0 THEN '{{}}'::jsonb END,
       CASE WHEN NOT (r = 1 OR mod(r, 32) = 0) THEN '{{}}' END
FROM generate_series(1, {REVISIONS}) AS r, generate_series(0, {HISTORIED - 1}) AS s;

INSERT INTO events (session_id, seq, kind, revision, phase, at, data)
SELECT 'm-' || lpad(s::text, 5, '0'), e, 'step', e, 'idle',
       CASE WHEN e <= {OLD_EVENTS}
            THEN now() - INTERVAL '40 days' + (e * {HISTORIED} + s) * INTERVAL '1 second'
            ELSE now() - INTERVAL '1 hour' END,
       '{{}}'
FROM generate_series(1, {EVENTS}) AS e, generate_series(0, {HISTORIED - 1}) AS s;

INSERT INTO workflow_steps (workflow_id, step_id, step_name, action, status, inputs, outputs,
                            dependencies, dependents, remaining_deps, max_retries, approval,
                            lease_expires_at, updated_at, generation)
SELECT 'm-wf-' || (i / 10), 's' || mod(i, 10), 'step', 'echo',
       CASE WHEN i < {APPROVAL_STEPS} THEN 'pending'
            WHEN i < {APPROVAL_STEPS + FORGOTTEN_STEPS} THEN 'pending'
            WHEN i < {APPROVAL_STEPS + 100} THEN 'running'
            ELSE 'success' END,
       '{{}}', '{{}}', '[]', '[]', 0, 0,
       CASE WHEN i < {APPROVAL_STEPS} THEN 'pending' END,
       extract(epoch FROM now()) + 3600,
       now() - INTERVAL '2 hours', 0
FROM generate_series(0, {APPROVAL_STEPS + 2000 - 1}) AS i;
"""


@pytest.fixture(scope="module")
def seeded(pg_url: str) -> Iterator[Engine]:
    """A database of its own: many sessions of many users (one user's every tenth),
    revision records interleaved in time as turns write them, steps waiting for
    approvals; analyzed."""
    name = f"{TEST_DB}_maint"
    recreate_database(name)
    engine = Backend.build(make_settings(f"{PG_SERVER}/{name}")).engine
    upgrade_schema(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(_SEED)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    yield engine
    engine.dispose()
    drop_database(name)


def explain(conn: Connection, statement: Any) -> dict[str, Any]:
    """The executed plan of ``statement`` (its effects stay in the caller's transaction)."""
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    found = conn.exec_driver_sql(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled}", compiled.params
    ).scalar_one()
    plan: dict[str, Any] = found[0]["Plan"]
    return plan


def nodes(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """The plan's nodes that read ``table`` (scans, and a bitmap's index scans under them)."""
    found = [plan] if plan.get("Relation Name") == table and "Scan" in plan["Node Type"] else []
    for child in plan.get("Plans", []):
        found.extend(nodes(child, table))
    return found


def kinds(plan: dict[str, Any]) -> set[str]:
    """Every node type in the plan."""
    found = {plan["Node Type"]}
    for child in plan.get("Plans", []):
        found |= kinds(child)
    return found


def bitmap_indexes(plan: dict[str, Any]) -> set[str]:
    """The indexes the bitmap index scans under ``plan`` read (through BitmapAnd/Or)."""
    found = set()
    for child in plan.get("Plans", []):
        if child["Node Type"] == "Bitmap Index Scan":
            found.add(child["Index Name"])
        else:
            found |= bitmap_indexes(child)
    return found


def read(plan: dict[str, Any], table: str) -> tuple[set[str], int, int]:
    """(how ``table`` is read: its indexes or node types, rows it returned, rows it read
    and dropped: by filter or index recheck, over every loop)."""
    how: set[str] = set()
    returned = dropped = 0
    for node in nodes(plan, table):
        loops = int(node.get("Actual Loops", 1))
        # A bitmap heap scan reads by the indexes of the bitmap index scans under it.
        how |= bitmap_indexes(node) or {node.get("Index Name") or node["Node Type"]}
        returned += int(node["Actual Rows"]) * loops
        dropped += int(node.get("Rows Removed by Filter", 0)) * loops
        dropped += int(node.get("Rows Removed by Index Recheck", 0)) * loops
    return how, returned, dropped


def test_the_sweep_reads_the_sessions_mid_turn_only(seeded: Engine) -> None:
    with seeded.connect() as conn:
        plan = explain(conn, queries.stuck_sessions_query(SWEEP_CUTOFF, 100))
    how, returned, dropped = read(plan, "sessions")
    assert returned == STUCK
    assert "Seq Scan" not in how and how <= {"ix_sessions_phase_updated"}, how
    # Before: ``phase NOT IN (waiting)`` read every session and dropped all but these.
    assert dropped <= 2 * STUCK, (how, returned, dropped)


def test_the_sweep_skips_steps_waiting_for_an_approval_without_reading_them(
    seeded: Engine,
) -> None:
    with seeded.connect() as conn:
        plan = explain(conn, queries.stuck_steps_query(SWEEP_CUTOFF, 100))
    how, returned, dropped = read(plan, "workflow_steps")
    assert returned == FORGOTTEN_STEPS, (how, returned, dropped)
    assert "Seq Scan" not in how and "ix_steps_unattended" in how, how
    # The running steps (live leases) are read to check them: active work, not the
    # thousands waiting for a decision.
    assert dropped <= 100 + 2 * FORGOTTEN_STEPS, (how, returned, dropped)


@pytest.mark.parametrize("user_id", [None, "m-user-5"], ids=["operator", "user"])
def test_a_deep_page_reads_what_it_returns(seeded: Engine, user_id: str | None) -> None:
    keys = (sessions.c.created_at, sessions.c.session_id)
    query = select(sessions.c.session_id, sessions.c.created_at)
    if user_id is not None:
        query = query.where(sessions.c.user_id == user_id)
    with seeded.connect() as conn:
        total = conn.execute(select(func.count()).select_from(query.subquery())).scalar_one()
    cursor, seen, depth_plans = None, 0, []
    while True:
        page = list_sessions(seeded, user_id=user_id, limit=50, cursor=cursor)
        seen += len(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        if seen in (50, 500) or seen > total - 100:
            with seeded.connect() as conn:
                statement = paging.page_query(query, keys, limit=50, cursor=cursor)
                depth_plans.append(explain(conn, statement))
    assert seen == total  # every session once, newest first
    for plan in depth_plans:
        how, returned, dropped = read(plan, "sessions")
        assert "Seq Scan" not in how and not {"Sort", "Incremental Sort"} & kinds(plan), plan
        assert returned <= 51 and dropped <= 2, (how, returned, dropped)


def test_erasure_batches_walk_the_users_index_from_where_they_stopped(seeded: Engine) -> None:
    walk = Walk(sessions.c.created_at, sessions.c.session_id, sessions.c.user_id)
    with seeded.connect() as conn:
        batches = 0
        while ids := walk.next_ids(conn, ERASED):
            batches += 1
            plan = explain(conn, walk.query(ERASED))
            how, returned, dropped = read(plan, "sessions")
            assert how == {"ix_sessions_user_created"}, how
            assert dropped <= 1, (how, returned, dropped)
            conn.execute(sessions.delete().where(sessions.c.session_id.in_(ids)))
        conn.rollback()
    assert batches == CROWD // 10 // 50
    assert not walk.again() and walk.again()


def test_a_prune_reads_only_what_it_deletes_and_nothing_when_nothing_is_due(
    seeded: Engine,
) -> None:
    """Every batch finds its checkpoints without dropping a row (before, each batch read
    again every kept old record), deletes below them reading no other row, and a run
    with nothing due reads nothing. Each session keeps its newest checkpoint older than
    the cutoff and all after it."""
    with seeded.connect() as conn:
        before = conn.execute(select(func.count()).select_from(revisions)).scalar_one()
    batches, deleted = 0, 0
    while True:
        with seeded.connect() as conn:
            plan = explain(conn, retention.due_checkpoints(CUTOFF, 100))
            how, returned, dropped = read(plan, "revisions")
            assert how == {"ix_revisions_unfloored"} and dropped == 0, (how, dropped)
            due = conn.execute(retention.due_checkpoints(CUTOFF, 100)).all()
            floors: dict[str, int] = {}
            for session_id, revision in due:
                floors[session_id] = max(revision, floors.get(session_id, 0))
            for session_id, floor in floors.items():
                statement = retention.below_floor_statement(session_id, floor, CUTOFF)
                how, returned, dropped = read(explain(conn, statement), "revisions")
                assert how == {"revisions_pkey"} and dropped == 0, (how, dropped)
            conn.rollback()
        with seeded.begin() as conn:
            found, gone = retention.revisions_batch(conn, CUTOFF, 100)
        deleted += gone
        batches += 1
        if found < 100:
            break
    # Checkpoints 1, 32 and 64 of each session aged past the cutoff: 64 is the floor.
    kept_each = REVISIONS - 64 + 1
    assert deleted == HISTORIED * (REVISIONS - kept_each) == before - HISTORIED * kept_each
    assert batches == HISTORIED * 3 // 100 + 1
    with seeded.connect() as conn:
        per_session = conn.execute(
            select(revisions.c.session_id, func.min(revisions.c.revision), func.count())
            .group_by(revisions.c.session_id)
            .having(func.min(revisions.c.revision) != 64)
        ).all()
        assert per_session == []
        plan = explain(conn, retention.due_checkpoints(CUTOFF, 100))
    how, returned, dropped = read(plan, "revisions")
    assert returned == 0 and dropped == 0, (how, returned, dropped)
    with seeded.begin() as conn:
        assert retention.revisions_batch(conn, CUTOFF, 100) == (0, 0)


def test_an_event_prune_starts_each_batch_where_the_last_one_ended(seeded: Engine) -> None:
    """Each batch finds where it ends, and deletes, by one range of ``ix_events_at`` that
    starts where the batch before ended (before, each started from the oldest entry
    again, past the entries of every row already deleted until a vacuum): nothing
    dropped, the pages read the same from the first batch to the last."""
    after, deleted, pages = None, 0, []
    while True:
        with seeded.connect() as conn:
            bound = explain(conn, old_events(CUTOFF, 1000, after))
            last = conn.execute(old_events(CUTOFF, 1000, after)).scalar()
            ranged = explain(conn, retention.events_through(CUTOFF, after, last))
            conn.rollback()
        for plan in (bound, ranged):
            how, _, dropped = read(plan, "events")
            assert how == {"ix_events_at"} and dropped == 0, how
        scan = nodes(bound, "events")[0]
        pages.append(int(scan["Shared Hit Blocks"]) + int(scan["Shared Read Blocks"]))
        with seeded.begin() as conn:
            gone, after = events_batch(conn, CUTOFF, 1000, after)
        deleted += gone
        if gone < 1000:
            break
    assert deleted == HISTORIED * OLD_EVENTS
    assert len(pages) == HISTORIED * OLD_EVENTS // 1000 + 1
    assert max(pages[1:]) <= 2 * pages[0] + 2, pages
