"""``make bench``'s rows at tiny sizes, with real workers: the bench code cannot rot unseen.

No timing is asserted (these machines are shared); what is checked is that the rows run
against real Redis, Postgres and Celery workers and yield finite figures, that the load
row's messages were each answered exactly once, and that the table renders.

``make test`` installs the ``dev`` extra only, which keeps its install quick: every row of
ours runs here with it. The rows that need the baselines' libraries (LangGraph, DBOS:
the ``bench`` extra) are a test of their own, reported as skipped, with the reason,
where that extra is not installed; nothing else is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from bench import anatomy, harness
from bench.__main__ import ROWS, render
from bench.rows import Row
from tests.support import BROKER_URL, REDIS_URL, TEST_DB

pytestmark = pytest.mark.workers

TINY = 0.001  # every size at its smallest
SMOKE_DB = f"{TEST_DB}_bench"
BASELINE_LIBRARIES = ("langgraph", "dbos", "psycopg_pool")


@pytest.fixture(scope="module")
def bench_target(pg_url: str) -> Iterator[None]:
    """The harness on the tests' Redis DB indexes and a database of its own."""
    saved = (harness.BENCH_DB, harness.REDIS_URL, harness.BROKER_URL)
    harness.configure(database=SMOKE_DB, redis_url=REDIS_URL, broker_url=BROKER_URL)
    harness.fresh_database()
    yield
    harness.drop(f"{SMOKE_DB}_dbos")
    harness.drop(SMOKE_DB)
    harness.configure(database=saved[0], redis_url=saved[1], broker_url=saved[2])


def run(*names: str) -> tuple[list[Row], list[str]]:
    table: list[Row] = []
    notes: list[str] = []
    args = argparse.Namespace(memory_turns=100)
    for name in names:
        ROWS[name](table, notes, TINY, args)
    return table, notes


def finite(table: list[Row]) -> None:
    for row in table:
        assert math.isfinite(row.ours) and row.ours >= 0, row
        assert math.isfinite(row.baseline) and row.baseline > 0, row


def test_our_rows_with_targets_run_and_give_finite_figures(bench_target: None) -> None:
    table, notes = run("latency", "dag", "history", "memory", "load", "lock")
    finite(table)
    assert {"floor chain: 6 hops, 1 commit each", "bare 6-hop chain"} <= {
        row.baseline_name for row in table
    }
    once = next(row for row in table if "answered exactly once" in row.name)
    assert once.verdict == "met" and once.ours == once.baseline == 10 * 5  # 10 sessions
    assert all(row.verdict in {"met", "missed"} for row in table if "x" in row.target)
    text = render(table, notes, 60.0, quick=True)
    assert text.count("\n| ") == len(table) + 1  # the header and one line per row


def test_the_prune_row_runs(bench_target: None) -> None:
    table, notes = run("prune")
    finite(table)
    assert [row.name for row in table] == [
        "prune rows/s (one run to completion)",
        "turn latency p99 every_phase, pruning vs not",
    ]
    assert table[0].verdict in {"met", "missed"} and notes


def test_the_scale_row_runs(bench_target: None) -> None:
    table, notes = run("scale")
    finite(table)
    assert [row.name.split(",")[0] for row in table] == [
        "recovery sweep",
        "page 95% down the listing of 500 sessions vs its first",
        "prune rows/s",
        "prune with nothing due",
        "erasure per session",
    ]
    assert all(row.verdict in {"met", "missed"} for row in table) and notes


def test_the_schedule_and_webhook_rows_run(bench_target: None) -> None:
    table, notes = run("ticks", "webhooks")
    finite(table)
    assert [row.name for row in table] == [
        "schedule ticks/s, 10 due at once",
        "webhook deliveries/s to a local receiver",
    ]
    assert len(notes) == 2


def test_the_event_log_rows_run(bench_target: None) -> None:
    table, _ = run("push", "eventlog", "turncost", "storage")
    finite(table[:-1])
    # A few turns may grow no table by a page (sizes are whole pages): no ratio to check.
    assert table[-1].ours >= 0 and table[-1].baseline >= 0
    assert [row.name.split(" (")[0] for row in table] == [
        "push latency p50",
        "push latency p95",
        "turns/s every_phase, event log + push vs push off",
        "turn in-process: phases, event push on vs off",
        "bytes stored per turn",
    ]


def test_the_observability_row_runs(bench_target: None) -> None:
    table, _ = run("observability")
    finite(table)
    assert [row.name for row in table] == [
        "turns/s every_phase [metrics on]",
        "turns/s every_phase [otel on]",
        "turns/s every_phase [metrics+otel on]",
        "worker CPU per turn [metrics on]",
        "worker CPU per turn [otel on]",
        "worker CPU per turn [metrics+otel on]",
    ]


def test_the_interactive_rows_run(bench_target: None) -> None:
    table, _ = run("streaming", "async")
    finite(table)
    assert [row.name for row in table] == [
        "time to first chunk p50",
        "time to first chunk p95",
        "chunks/s per follower (4 following)",
        "turns/s AsyncAgentClient",
    ]


def test_the_fair_share_rows_run(bench_target: None) -> None:
    table, notes = run("fairshare")
    finite(table)
    names = [row.name for row in table]
    assert names[:4] == [
        "fair-share: other user's turn p50 under a burst",
        "fair-share: other user's turn p95 under a burst",
        "fair-share: other user's turn p99 under a burst",
        "fair-share: other user's turn max under a burst",
    ]
    assert "cap 2" in names[4]
    assert any(note.startswith("fair-share:") for note in notes)


def test_the_fair_tail_rows_run(bench_target: None) -> None:
    table, notes = run("fairtail")
    finite(table)
    names = [row.name for row in table]
    for label in ("two users at their caps", "operator work"):
        for name in ("p50", "p99", "max"):
            assert f"fair tail: other user's turn {name}, {label}" in names
    assert sum(note.startswith("fair tail") for note in notes) == 2


def test_a_row_verdict_reads_its_target() -> None:
    assert Row("a", 9.0, 10.0, "x/s", "b", target=">= 0.9x").verdict == "met"
    assert Row("a", 8.0, 10.0, "x/s", "b", target=">= 0.9x").verdict == "missed"
    assert Row("a", 13.0, 10.0, "ms", "b", False, "<= 1.2x").verdict == "missed"
    assert Row("a", 1.0, 2.0, "s", "b", False, "report").verdict == ""
    assert Row("a", 1.0, 2.0, "n", "b", target="all", check=False).verdict == "missed"


@pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in BASELINE_LIBRARIES),
    reason="the bench extra (LangGraph, DBOS) is not installed: pip install -e '.[bench]'",
)
def test_the_throughput_row_runs_every_baseline(bench_target: None) -> None:
    table, _ = run("throughput")
    finite(table)
    assert {
        "floor: 6 hops, 1 commit each",
        "LangGraph in-process",
        "LangGraph, 1 Celery task per turn",
        "DBOS, 6-step durable workflow",
        "bare 6-hop chain",
    } <= {row.baseline_name for row in table}
    assert all(row.verdict in {"met", "missed"} for row in table if row.target)


@pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("dbos", "pydantic_ai")),
    reason="the pydantic-ai row needs DBOS and Pydantic AI (the bench and pydantic-ai extras)",
)
def test_the_pydantic_ai_row_runs_against_dbos(bench_target: None) -> None:
    table, notes = run("pydantic-ai")
    finite(table)
    assert [row.name for row in table] == ["turns/s Pydantic AI agent (a tool call per turn)"]
    assert len(notes) == 1


def test_the_carry_row_runs(bench_target: None) -> None:
    table, _ = run("carry")
    finite(table)
    assert [row.name for row in table] == [
        "turns/s every_phase [carried]",
        "turns/s every_phase [not carried]",
        "turns/s every_phase, carried vs not",
        "turn latency p50 every_phase [carried]",
        "turn latency p50 every_phase [not carried]",
        "turn in-process: phases, carried vs not",
    ]


def test_the_cpu_row_counts_each_role(bench_target: None) -> None:
    table, notes = run("cpu")
    finite(table)
    by_name = {row.name: row for row in table}
    for name in ("every_phase", "inline"):
        # Each part of the pipeline was found and charged: a role whose processes were
        # not recognised would read zero.
        for role in ("children", "worker main", "Postgres", "client"):
            assert by_name[f"CPU per turn {name} [{role}]"].ours > 0, (name, role)
        parts = sum(by_name[f"CPU per turn {name} [{r}]"].ours for r in anatomy.ROLES)
        assert by_name[f"CPU per turn {name}"].ours == pytest.approx(parts)
        assert by_name[f"context switches per turn {name}"].ours > 0
    write = anatomy.WRITE_FLOOR
    for role in ("children", "worker main", "Postgres", "client"):
        assert by_name[f"CPU per turn {write} [{role}]"].ours > 0, role
    assert by_name[f"turns/s {write}"].ours > 0
    assert any(note.startswith("cpu:") for note in notes)
    _each_write_hop_committed_a_phase()


def _each_write_hop_committed_a_phase() -> None:
    """The floor + phase write's chains wrote what phases write: each of its sessions is
    at revision 6, with six phase_committed events and a revision record for each."""
    from bench.floor_tasks import WRITE_USER

    engine = create_engine(harness.DATABASE_URL)
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT s.revision, s.phase,"
                " (SELECT count(*) FROM events e WHERE e.session_id = s.session_id"
                "  AND e.kind = 'phase_committed'),"
                " (SELECT count(*) FROM revisions r WHERE r.session_id = s.session_id)"
                " FROM sessions s WHERE s.user_id = :user"
            ),
            {"user": WRITE_USER},
        ).all()
    engine.dispose()
    assert found, "no floor + phase write session"
    assert {tuple(row) for row in found} == {(6, "understanding", 6, 7)}


# A scan of the inbox through an index whose first column is the session id.
_BY_SESSION = r"(Index (Only )?Scan using|Bitmap Index Scan on) uq_inbox_session_(seq|key) "


def test_the_completion_poll_reads_only_the_polled_sessions(bench_target: None) -> None:
    """The poll that tells the bench our turns are done must not cost the Postgres under
    test in proportion to everything answered before: it reads by an index keyed by
    session, not the whole table (for a batch's 50 ids, a sequential scan took 1.5 ms a
    poll at a few thousand; a plan on the index of message states, dropped since, walked
    every answered message, 2.3 ms a poll at 10,000)."""
    engine = create_engine(harness.DATABASE_URL)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO inbox (message_id, session_id, seq, text, state, created_at) "
                "SELECT 'old-' || g, 'old-' || (g / 5), g % 5, 'x', 'answered', now() "
                "FROM generate_series(1, 3000) AS g"
            )
        )
    engine.dispose()
    harness.analyze()
    for polled in (["polled-1", "polled-2"], [f"polled-{i}" for i in range(50)]):
        plan = harness.answered_plan(polled)
        assert "Seq Scan" not in plan, plan
        assert re.search(_BY_SESSION, plan), plan


def test_the_lg_row_runs(bench_target: None) -> None:
    table, notes = run("lg")
    finite(table)
    assert table[0].name == "runs/s through /lg (langgraph-sdk) vs the Python client"
    assert any(note.startswith("lg: ") for note in notes)


def test_the_http_rows_run(bench_target: None) -> None:
    table, _ = run("http", "followers")
    finite(table)
    assert [row.name for row in table] == [
        "turns/s sent over HTTP (serve) vs the Python client",
        "message accepted p50, HTTP vs the Python client",
        "event streams held by one serve process",
        "serve RSS per open event stream",
        "a reply reaching all 4 streams",
    ]
    held = table[2]
    assert held.verdict == "met" and held.ours == held.baseline == 4
