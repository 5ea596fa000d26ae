"""Rows of deployment choices: the broker (RabbitMQ vs Redis) and the database pooler
(PgBouncer vs straight to Postgres). Each compares agentstate with itself, deployed two
ways, in the worker shape of every other row (``suite.SHAPE``), warm.
"""

from __future__ import annotations

from typing import Any

from bench import harness, rows
from bench.harness import say
from bench.rows import Row
from bench.suite import SHAPE, Table, sized
from config import HopPolicy
from config.settings import DbPooler, QueueType


def brokers(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """Turns/s with RabbitMQ as the broker (quorum and classic queues) vs Redis."""
    from tests.infra import RabbitVhost

    rabbit = RabbitVhost(harness.AMQP_URL).ensure()
    sessions, per = sized(20, scale, 4), sized(5, scale, 1)
    runs: dict[str, dict[str, Any]] = {
        "Redis": {},
        "RabbitMQ quorum": {"broker_url": rabbit.url},
        "RabbitMQ classic": {"broker_url": rabbit.url, "broker_queue_type": QueueType.CLASSIC},
    }
    rounds: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(2):  # the brokers take turns, so that load from elsewhere hits each alike
        for label, overrides in runs.items():
            settings = harness.bench_settings(**overrides)
            try:
                with harness.workers(settings, **SHAPE):
                    rounds[label].append(rows.turns_per_second(settings, sessions, per))
            finally:
                if "broker_url" in overrides:
                    rabbit.delete_queue(settings.queue)
            say(f"{label}: every_phase {rounds[label][-1]:.1f} turns/s")
    measured = {label: harness.median(values) for label, values in rounds.items()}
    for label in ("RabbitMQ quorum", "RabbitMQ classic"):
        table.append(
            Row(
                f"turns/s every_phase [{label}]",
                measured[label],
                measured["Redis"],
                "turns/s",
                "Redis broker",
            )
        )
    notes.append(
        "brokers: RabbitMQ publishes with confirms; a quorum queue also fsyncs each "
        "message to its log before confirming (one node here)."
    )


def pooling(table: Table, notes: list[str], scale: float, args: Any) -> None:
    """The inline fast path through PgBouncer (transaction mode, unprepared statements)
    vs straight to Postgres (prepared), and unprepared straight to Postgres."""
    from tests.infra import PgBouncer

    bouncer = PgBouncer(pool_size=10).start()
    sessions, per = sized(20, scale, 4), sized(5, scale, 1)
    runs: dict[str, dict[str, Any]] = {
        "prepared, direct": {},
        "unprepared, direct": {"db_pooler": DbPooler.PGBOUNCER},
        "unprepared, PgBouncer": {
            "db_pooler": DbPooler.PGBOUNCER,
            "database_url": f"{bouncer.server}/{harness.BENCH_DB}",
        },
    }
    measured: dict[str, float] = {}
    try:
        configured = {
            label: harness.bench_settings(hop_policy=HopPolicy.INLINE, **overrides)
            for label, overrides in runs.items()
        }
        commits = rows.commit_micros(configured, sized(200, scale, 20))
        for label, settings in configured.items():
            with harness.workers(settings, **SHAPE):
                measured[label] = rows.turns_per_second(settings, sessions, per)
            say(f"{label}: {commits[label]:.0f} us a commit, inline {measured[label]:.1f} turns/s")
    finally:
        notes.append(f"pooling: {bouncer.version()}, transaction mode, 10 server connections.")
        bouncer.close()
    for label in ("unprepared, direct", "unprepared, PgBouncer"):
        table.append(
            Row(
                f"phase commit [{label}]",
                commits[label],
                commits["prepared, direct"],
                "us",
                "prepared, direct",
                higher_is_better=False,
            )
        )
        table.append(
            Row(
                f"turns/s inline [{label}]",
                measured[label],
                measured["prepared, direct"],
                "turns/s",
                "prepared, direct",
            )
        )
