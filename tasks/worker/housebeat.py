"""Workers send the periodic tasks of the beat schedule themselves, so a deployment of
workers alone keeps every liveness promise (lost enqueues re-sent by the sweep, schedule
ticks fired, webhooks delivered, retention run) without ``celery beat``.

Each worker's main process looks every second; for each entry of the schedule whose period
is due, the first worker to take the entry's Redis lease (``SET NX PX``, one period long)
sends it, so the fleet sends each entry about once per period however many workers run.
A beat beside them is still fine: every periodic task is safe to run twice (the sweep
holds its own lock; ticks and deliveries are guarded rows). If the broker or Redis is
away, nothing is sent and the next look tries again."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown
from kombu.exceptions import OperationalError

from state.storage import keys

logger = logging.getLogger(__name__)
LOOK_EVERY_S = 1.0

_stop = threading.Event()


@dataclass(frozen=True)
class Entry:
    """One periodic task of the beat schedule."""

    name: str
    task: str
    period_s: float
    options: dict[str, Any]


def entries(schedule: dict[str, dict[str, Any]]) -> list[Entry]:
    """The beat schedule's entries with a period in seconds (all of agentstate's are)."""
    found = []
    for name, entry in schedule.items():
        period = entry["schedule"]
        seconds = period if isinstance(period, int | float) else period.total_seconds()
        found.append(Entry(name, entry["task"], float(seconds), dict(entry.get("options", {}))))
    return found


def send_due(app: Any, client: redis.Redis, queue: str, node: str, due: list[Entry]) -> list[str]:
    """Send each entry whose lease this worker takes; the names sent."""
    sent = []
    for entry in due:
        key = keys.house_beat(queue, entry.name)
        if not client.set(key, node, nx=True, px=max(int(entry.period_s * 1000), 1)):
            continue  # another worker sent it this period
        try:
            app.send_task(entry.task, **entry.options)
        except OperationalError as exc:  # the broker is away: the next look tries again
            client.delete(key)
            logger.warning("could not send %s (the broker: %r); trying again", entry.task, exc)
            continue
        sent.append(entry.name)
    return sent


@worker_ready.connect
def _start(sender: Any = None, **_: object) -> None:
    from state.storage.redis_client import get_redis
    from tasks.worker.startup import settings_or_exit

    if sender is None:
        return
    settings = settings_or_exit()
    if not settings.worker_beat:
        return
    app, node = sender.app, str(sender.hostname)
    schedule = entries(app.conf.beat_schedule or {})
    client = get_redis(settings.redis_url)

    def loop() -> None:
        while not _stop.wait(LOOK_EVERY_S):
            try:
                send_due(app, client, settings.queue, node, schedule)
            except redis.RedisError as exc:  # Redis is away: the next look tries again
                logger.debug("periodic tasks not sent this second: %r", exc)

    threading.Thread(target=loop, name="agentstate-house-beat", daemon=True).start()


@worker_shutdown.connect
def _leave(**_: object) -> None:
    _stop.set()
