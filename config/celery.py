"""The Celery configuration, built from Settings (JSON only, late acks, events on)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from config.brokers import broker_for
from config.settings import Settings

TASK_MODULES = [
    "tasks.worker.phases",
    "tasks.worker.steps",
    "tasks.worker.maintenance",
    "tasks.worker.clock",
]
# Bare tasks to measure against; off in production (they bump counters on request).
BASELINE_MODULES = ["tasks.worker.baseline"]
# Retention (events, revisions, sessions, workflows) runs hourly, each run to completion.
PRUNE_INTERVAL_S = 3600.0


def celery_config(settings: Settings) -> dict[str, Any]:
    """Every Celery setting agentstate relies on."""
    config = {
        # The URL, transport and queues for Redis, Redis Sentinel or RabbitMQ.
        **broker_for(settings).options(),
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        # JSON only, in and out: a pickled message is refused, never executed.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # At-least-once: a message is acknowledged after its task ran, and a task whose
        # worker died is delivered again. Version checks make the repeat harmless.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # A runaway task is stopped (the sweep resumes its work), a leaking child replaced.
        "task_soft_time_limit": settings.task_soft_time_limit,
        "task_time_limit": settings.task_time_limit,
        "worker_max_memory_per_child": settings.worker_max_memory_per_child or None,
        # Flower watches the workers' task events (received, started, succeeded, ...).
        # A "sent" event per enqueue would double the cost of every hop for one more
        # state in Flower's table, so it is off.
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": False,
        "task_default_queue": settings.queue,
        # Malformed messages are refused on one log line instead of stopping the worker.
        "worker_consumer": "tasks.worker.guard:Consumer",
        "imports": [
            *TASK_MODULES,
            *(BASELINE_MODULES if settings.baseline_tasks else []),
            *settings.action_module_list,
        ],
        "timezone": "UTC",
        "beat_schedule": {
            "agentstate-recovery-sweep": {
                "task": "agentstate.recovery.sweep",
                "schedule": settings.sweep_interval,
            },
            "agentstate-expire-idle-sessions": {
                "task": "agentstate.session.expire_idle",
                "schedule": max(settings.sweep_interval, 60.0),
            },
            "agentstate-expire-approvals": {
                "task": "agentstate.approvals.expire",
                "schedule": settings.sweep_interval,
            },
            # Schedule ticks and webhook deliveries; a late copy is dropped, the next one
            # finds whatever it would have (ticks and deliveries wait in the database).
            "agentstate-clock": {
                "task": "agentstate.clock.tick",
                "schedule": settings.tick_interval,
                "options": {"expires": max(settings.tick_interval * 5, 5.0)},
            },
            "agentstate-prune-events": {
                "task": "agentstate.events.prune",
                "schedule": PRUNE_INTERVAL_S,
            },
        },
        "beat_schedule_filename": str(Path(tempfile.gettempdir()) / "agentstate-beat-schedule"),
    }
    return config
