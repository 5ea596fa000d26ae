"""A worker's main process tells the fleet how many children it runs, every few seconds
(state.workflows.fleet): the fleet-wide cap of claimed steps is counted from what live
workers said. A thread of the main process, started once the pool has forked, so no
child inherits it."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from config.settings import STEP_QUEUE_SUFFIX
from state.workflows import fleet

logger = logging.getLogger(__name__)

_stop = threading.Event()
_announced: list[tuple[str, str]] = []  # (queue, node) this process announced


def serves(queues: set[str], queue: str) -> str | None:
    """What a worker consuming ``queues`` serves of ``queue``: "both", "steps", "turns",
    or None (neither)."""
    turns, steps = queue in queues, f"{queue}{STEP_QUEUE_SUFFIX}" in queues
    if turns and steps:
        return "both"
    return "steps" if steps else "turns" if turns else None


def _children(consumer: Any) -> int:
    pool = getattr(consumer, "pool", None)
    size = getattr(pool, "num_processes", None) or getattr(consumer.controller, "concurrency", 0)
    return int(size or 0)


@worker_ready.connect
def _start(sender: Any = None, **_: object) -> None:
    from state.storage.redis_client import get_redis
    from tasks.worker.startup import settings_or_exit

    if sender is None:
        return
    settings = settings_or_exit()
    queues = set(sender.app.amqp.queues.consume_from or ())
    what = serves(queues, settings.queue)
    if what is None:
        return
    node, queue = str(sender.hostname), settings.queue
    client = get_redis(settings.redis_url)
    _announced.append((queue, node))

    def loop() -> None:
        while not _stop.is_set():
            try:
                fleet.announce(client, queue, node, _children(sender), what)
            except redis.RedisError as exc:  # the cap is lifted until Redis is back
                logger.debug("could not announce this worker's children: %r", exc)
            _stop.wait(fleet.ANNOUNCE_EVERY_S)

    threading.Thread(target=loop, name="agentstate-fleet", daemon=True).start()


@worker_shutdown.connect
def _leave(**_: object) -> None:
    from state.storage.redis_client import get_redis
    from tasks.worker.startup import settings_or_exit

    _stop.set()
    for queue, node in _announced:
        # (If Redis is away, the worker stops counting after ALIVE_FOR_S anyway.)
        with contextlib.suppress(redis.RedisError):
            fleet.leave(get_redis(settings_or_exit().redis_url), queue, node)
