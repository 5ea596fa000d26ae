"""Turns, workflows, timers, the sweep's backlog check and Flower on RabbitMQ.

The representative tests of test_turns.py, test_workflows.py and test_flower.py run here
again with ``AGENTSTATE_BROKER_URL=amqp://...`` (a vhost of the tests' own, created with
rabbitmqctl when missing): the queue is a durable quorum queue on a topic exchange, and
countdowns (step retries, deadlines) go through RabbitMQ's delayed-delivery queues.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from config import Settings
from config.brokers import broker_for
from tasks.app import make_app
from tasks.client import AgentClient
from tasks.dispatch.dispatcher import CeleryDispatcher
from tests.e2e.test_flower import (  # noqa: F401  (collected here again, on RabbitMQ)
    flower,
    test_flower_sees_the_workers_and_every_phase_task_of_a_turn,
)
from tests.e2e.test_turns import (  # noqa: F401
    test_a_phase_task_delivered_twice_is_applied_once,
    test_messages_are_processed_in_arrival_order,
    test_multi_part_question_is_answered_through_a_workflow,
    test_sixty_messages_from_six_threads_to_one_session,
    test_twenty_sessions_three_questions_each,
)
from tests.e2e.test_workflows import (  # noqa: F401
    effects,
    test_a_step_failing_for_good_skips_dependents_only,
    test_a_step_failing_twice_then_succeeding,
    test_diamond_computes_through_dependency_outputs,
    test_the_same_step_task_delivered_twice_has_one_side_effect,
)
from tests.infra import RabbitVhost
from tests.support import Workers, make_settings, uid

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def rabbit() -> RabbitVhost:
    return RabbitVhost().ensure()


@pytest.fixture(scope="module")
def worker_settings(pg_url: str, rabbit: RabbitVhost) -> Iterator[Settings]:
    settings = make_settings(
        pg_url,
        broker_url=rabbit.url,
        queue=uid("q"),
        stuck_after=30.0,
        retry_backoff=0.05,
        action_modules="tests.actions_for_tests",
    )
    yield settings
    rabbit.delete_queue(settings.queue)  # quorum queues outlive their consumers


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    return AgentClient(worker_settings)


def test_the_queue_is_a_quorum_queue_and_the_backlog_counts_it(
    client: AgentClient, rabbit: RabbitVhost, worker_settings: Settings
) -> None:
    assert rabbit.queue_types()[worker_settings.queue] == "quorum"
    assert client.dispatcher.backlog() == 0  # the workers keep it drained
    idle = worker_settings.model_copy(update={"queue": uid("q")})  # nobody consumes it
    dispatcher = CeleryDispatcher(make_app(idle), broker_for(idle))
    try:
        assert dispatcher.backlog() == 0  # not declared yet
        for n in range(3):
            dispatcher.phase("planning", uid("s"), n)
        assert dispatcher.backlog() == 3
        # Not looked into (a message cannot be read without being taken): the sweep's
        # re-sends of waiting work back off there instead.
        assert dispatcher.oldest_queued() is None
        assert rabbit.queue_types()[idle.queue] == "quorum"
    finally:
        rabbit.delete_queue(idle.queue)


def test_countdowns_use_rabbitmqs_delayed_delivery(
    client: AgentClient, rabbit: RabbitVhost, worker_settings: Settings
) -> None:
    # A step retry is a countdown: it waits in RabbitMQ's delay queues, not in a worker
    # (which, with a quorum queue's fixed prefetch, would block that worker meanwhile).
    test_a_step_failing_twice_then_succeeding(client)
    out = subprocess.run(
        ["rabbitmqctl", "list_bindings", "-q", "-p", rabbit.vhost, "--no-table-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    routes = [line.split("\t") for line in out.splitlines()]
    assert any(
        r[0] == "celery_delayed_delivery" and r[2] == worker_settings.queue for r in routes
    ), out
