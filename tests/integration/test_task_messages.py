"""What Celery really puts on the broker for agentstate tasks passes the message guard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from tasks.app import make_app
from tasks.worker import phases, steps
from tasks.worker.guard import TaskSignature, check_message
from tests.support import BROKER_URL, make_settings, uid

PLANNING = "agentstate.phase.planning"
TIMEOUT = "agentstate.session.timeout"
STEP = "agentstate.workflow.step"
REGISTERED = (phases, steps)  # imported for their tasks


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    """An app on the test broker; agentstate's tasks are shared, so it has them too."""
    celery = make_app(make_settings("sqlite://"))
    assert {PLANNING, TIMEOUT, STEP} <= set(celery.tasks)
    yield celery
    celery.close()


def _take(queue: str) -> Any:
    with Connection(BROKER_URL) as conn:
        waiting = conn.SimpleQueue(queue)
        try:
            message = waiting.get(timeout=5)
            message.ack()
            return message
        finally:
            waiting.close()


def test_a_retry_sent_from_inside_a_task_passes_the_guard(app: Celery) -> None:
    """Task.retry (our transient-error path) copies the request's own headers onward."""
    task = app.tasks[PLANNING]
    queue = uid("q")
    first = app.amqp.as_task_v2(
        "3f2a-first", PLANNING, ["s-1", 4], {}, time_limit=30, soft_time_limit=20, expires=600
    )
    task.push_request(
        **first.headers,
        args=["s-1", 4],
        kwargs={},
        delivery_info={"exchange": "", "routing_key": queue},
        called_directly=False,
        hostname="w1@localhost",
    )
    try:
        task.retry(countdown=0.5, throw=False)
    finally:
        task.pop_request()

    message = _take(queue)
    assert message.headers["retries"] == 1 and message.headers["eta"]
    expected = TaskSignature.of(task.name, task.run)
    check_message(expected, message.headers, message.payload, named_in_headers=True)


def test_send_task_with_every_option_we_use_passes_the_guard(app: Celery) -> None:
    queue = uid("q")
    app.send_task(PLANNING, args=["s-1", None], queue=queue)
    app.send_task(TIMEOUT, args=["s-1", 1.5e9], countdown=30, queue=queue)
    app.send_task(STEP, args=["wf-1", "a", 3], countdown=0.2, queue=queue)
    for _ in range(3):
        message = _take(queue)
        task = app.tasks[message.headers["task"]]
        expected = TaskSignature.of(task.name, task.run)
        check_message(expected, message.headers, message.payload, named_in_headers=True)
