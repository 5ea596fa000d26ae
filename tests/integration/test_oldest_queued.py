"""When the oldest of our messages still in a Redis queue was sent: the recovery sweep
leaves alone work sent after it (still queued, not lost). Real Redis broker."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tasks.app import make_app
from tasks.dispatch.dispatcher import CeleryDispatcher
from tests.support import BROKER_URL, make_settings, uid


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    celery = make_app(make_settings("sqlite://", queue=uid("q")))
    yield celery
    celery.close()


def test_the_oldest_queued_message_says_when_it_was_sent(app: Celery) -> None:
    dispatcher = CeleryDispatcher(app)
    broker = redis.Redis.from_url(BROKER_URL)
    queue = app.conf.task_default_queue
    try:
        assert dispatcher.oldest_queued() is None  # nothing queued
        before = time.time()
        dispatcher.phase("planning", "s-1", 1)  # the direct path
        time.sleep(0.01)
        dispatcher.step("wf-1", "a", 0, delay_s=0)
        app.send_task("agentstate.phase.planning", args=["s-2", 1])  # another sender's
        dispatcher._send("agentstate.phase.planning", ["s-3", 1], retries=0)  # send_task's
        first = dispatcher.oldest_queued()
        assert first is not None and before - 0.01 <= first <= time.time()
        # Taken from the queue (by a worker): the next one's time.
        broker.rpop(queue)
        second = dispatcher.oldest_queued()
        assert second is not None and second >= first
        # Messages of another sender, without our header, are looked past.
        broker.rpop(queue)
        assert dispatcher.oldest_queued() is not None
        broker.rpop(queue)
        assert dispatcher.oldest_queued() is None  # only another sender's left
        # The steps' queue is looked at on its own.
        steps = dispatcher.oldest_queued(steps=True)
        queued_steps = broker.llen(dispatcher.step_queue or queue)
        assert (steps is not None) == (queued_steps > 0)
    finally:
        broker.delete(queue)
        broker.close()
