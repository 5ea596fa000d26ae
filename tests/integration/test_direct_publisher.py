"""The direct publisher (``tasks.dispatch.publisher``) puts on the broker what ``send_task`` would,
from inside a worker task, and steps aside everywhere else."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery._state import _task_stack
from kombu.exceptions import OperationalError

from tasks.app import make_app
from tasks.dispatch.dispatcher import CeleryDispatcher
from tasks.dispatch.publisher import RETRY_DIRECT_AFTER_S
from tasks.worker import phases, steps
from tasks.worker.guard import TaskSignature, check_message
from tests.services import PrivateRedis
from tests.support import BROKER_URL, make_settings, uid

PLANNING = "agentstate.phase.planning"
STEP = "agentstate.workflow.step"
REGISTERED = (phases, steps)  # imported for their tasks
# Set per message: compared for shape, not value. (The time our messages were sent, which
# the recovery sweep reads off the oldest queued one, is ours alone: CeleryDispatcher adds
# it on send_task's path too.)
PER_MESSAGE = {"id", "correlation_id", "delivery_tag", "agentstate_sent"}


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    """An app on the test broker whose default queue is this test's own."""
    celery = make_app(make_settings("sqlite://", queue=uid("q")))
    yield celery
    celery.close()


@pytest.fixture
def dispatcher(app: Celery) -> CeleryDispatcher:
    return CeleryDispatcher(app)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(BROKER_URL)
    yield client
    client.close()


@contextmanager
def inside_a_task(
    app: Celery, task_id: str = "parent-1", root_id: str = "root-1"
) -> Iterator[None]:
    """What a worker's pool child has while it runs a task: the task and its request on
    Celery's task stack."""
    task = app.tasks[PLANNING]
    task.push_request(id=task_id, root_id=root_id, called_directly=False)
    _task_stack.push(task)
    try:
        yield
    finally:
        _task_stack.pop()
        task.pop_request()


def _queued(broker: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(broker.lrange(queue, 0, -1))]


def _without_per_message(envelope: dict[str, Any]) -> dict[str, Any]:
    def strip(part: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in part.items() if k not in PER_MESSAGE}

    return {
        **strip(envelope),
        "headers": strip(envelope["headers"]),
        "properties": strip(envelope["properties"]),
    }


def test_a_hop_is_the_message_send_task_would_send_from_a_task(
    app: Celery, broker: redis.Redis
) -> None:
    queue = app.conf.task_default_queue
    dispatcher = CeleryDispatcher(app)
    args = ["s-1", 4]
    with inside_a_task(app):
        assert dispatcher.direct.publish(PLANNING, args, repr(args))
        app.send_task(PLANNING, args=args, argsrepr=repr(args), kwargsrepr="{}")
    ours, celerys = _queued(broker, queue)
    assert _without_per_message(ours) == _without_per_message(celerys)
    assert ours["headers"]["parent_id"] == "parent-1" and ours["headers"]["root_id"] == "root-1"
    assert ours["headers"]["id"] == ours["properties"]["correlation_id"] != celerys["headers"]["id"]
    broker.delete(queue)


def test_a_hop_passes_the_message_guard_and_reaches_the_task(
    app: Celery, broker: redis.Redis
) -> None:
    from kombu import Connection

    queue = f"{app.conf.task_default_queue}.steps"  # steps have a queue of their own
    with inside_a_task(app):
        CeleryDispatcher(app).step("wf-1", "a", 3)
    with Connection(BROKER_URL) as conn:
        waiting = conn.SimpleQueue(queue)
        message = waiting.get(timeout=5)
        message.ack()
        waiting.close()
    task = app.tasks[STEP]
    assert message.payload[0] == ["wf-1", "a", 3]
    check_message(
        TaskSignature.of(task.name, task.run),
        message.headers,
        message.payload,
        named_in_headers=True,
    )


def test_what_a_message_carries_passes_the_guard_and_is_shown_short(
    app: Celery, broker: redis.Redis
) -> None:
    """Flower and the logs show the arguments' repr: a carried step or snapshot appears
    there as its size, not its contents."""
    queue = app.conf.task_default_queue
    dispatcher = CeleryDispatcher(app)
    step_payload, snapshot = '{"action": "echo"}', '{"doc": {"secret": 1}}'
    with inside_a_task(app):
        dispatcher.step("wf-1", "a", 3, carried=step_payload)
        dispatcher.phase("planning", "s-1", 4, snapshot)
    (step_message,) = _queued(broker, f"{queue}.steps")
    (phase_message,) = _queued(broker, queue)
    broker.delete(queue, f"{queue}.steps")
    assert step_message["headers"]["argsrepr"] == "['wf-1', 'a', 3, '<step, 18 chars>']"
    assert phase_message["headers"]["argsrepr"] == "['s-1', 4, '<snapshot, 22 chars>']"
    for message, name in ((step_message, STEP), (phase_message, PLANNING)):
        body = json.loads(base64.b64decode(message["body"]))
        assert body[0][-1] in (step_payload, snapshot)
        task = app.tasks[name]
        signature = TaskSignature.of(task.name, task.run)
        check_message(signature, message["headers"], body, named_in_headers=True)


def test_a_clients_send_is_a_root_message_like_send_tasks(app: Celery, broker: redis.Redis) -> None:
    queue = app.conf.task_default_queue
    dispatcher = CeleryDispatcher(app)
    assert dispatcher.direct.publish(PLANNING, ["s-1", 1], "['s-1', 1]")
    app.send_task(PLANNING, args=["s-1", 1], argsrepr="['s-1', 1]", kwargsrepr="{}")
    ours, celerys = _queued(broker, queue)
    for message in (ours, celerys):  # a root message is its own root
        assert message["headers"].pop("root_id") == message["headers"]["id"]
    assert _without_per_message(ours) == _without_per_message(celerys)
    assert ours["headers"]["parent_id"] is None
    broker.delete(queue)


def test_a_publish_signal_receiver_gets_every_hop(app: Celery, broker: redis.Redis) -> None:
    seen: list[str] = []

    def watch(sender: str | None = None, **_: Any) -> None:
        seen.append(str(sender))

    signals.before_task_publish.connect(watch, weak=False)
    try:
        with inside_a_task(app):
            dispatcher = CeleryDispatcher(app)
            assert not dispatcher.direct.publish(PLANNING, ["s-1", 2], "")
            dispatcher.phase("planning", "s-1", 2)
    finally:
        signals.before_task_publish.disconnect(watch)
    assert seen == [PLANNING]
    assert len(_queued(broker, app.conf.task_default_queue)) == 1
    broker.delete(app.conf.task_default_queue)


def test_steps_and_turns_go_to_queues_of_their_own(app: Celery, broker: redis.Redis) -> None:
    """A turn never waits behind workflow steps: each has its own queue, and a retry's
    countdown (send_task's path) lands on the steps' queue too."""
    queue = app.conf.task_default_queue
    dispatcher = CeleryDispatcher(app)
    with inside_a_task(app):
        dispatcher.step("wf-1", "a", 3)
        dispatcher.phase("planning", "s-1", 4)
    steps_sent = [json.loads(_body(m))[0] for m in _queued(broker, f"{queue}.steps")]
    turns_sent = [json.loads(_body(m))[0] for m in _queued(broker, queue)]
    broker.delete(queue, f"{queue}.steps")
    assert steps_sent == [["wf-1", "a", 3]]
    assert turns_sent == [["s-1", 4]]


def test_rabbitmq_and_task_routes_keep_celerys_path(redis_url: str) -> None:
    rabbit = make_app(make_settings("sqlite://", broker_url="amqp://guest:guest@127.0.0.1//"))
    routed = make_app(make_settings("sqlite://", queue=uid("q")))
    routed.conf.task_routes = {PLANNING: {"queue": "elsewhere"}}
    for app in (rabbit, routed):
        with inside_a_task(app):
            # Decided without a broker round trip: nothing is sent either way.
            assert not CeleryDispatcher(app).direct.publish(PLANNING, ["s-1", 3], "")
        app.close()


def test_a_killed_connection_loses_no_hop_and_doubles_none(
    app: Celery, broker: redis.Redis, dispatcher: CeleryDispatcher
) -> None:
    queue = app.conf.task_default_queue
    with inside_a_task(app):
        dispatcher.phase("planning", "s-1", 1)
        channel = dispatcher.direct._local.channel
        killed = broker.client_kill_filter(_id=channel.client.client_id())
        assert killed == 1
        dispatcher.phase("planning", "s-1", 2)
        dispatcher.phase("planning", "s-1", 3)
    revisions = [json.loads(_body(m))[0][1] for m in _queued(broker, queue)]
    assert revisions == [1, 2, 3]
    broker.delete(queue)


def test_a_forked_child_publishes_on_a_connection_of_its_own(
    app: Celery, broker: redis.Redis, dispatcher: CeleryDispatcher
) -> None:
    queue = app.conf.task_default_queue
    with inside_a_task(app):
        dispatcher.phase("planning", "parent", 1)  # the parent's channel is open
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = dispatcher.direct.publish(PLANNING, ["child", 1], "")
            os._exit(0 if ok and dispatcher.direct._local.pid == os.getpid() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        dispatcher.phase("planning", "parent", 2)  # the parent's socket still works
    sessions = [json.loads(_body(m))[0] for m in _queued(broker, queue)]
    assert sessions == [["parent", 1], ["child", 1], ["parent", 2]]
    broker.delete(queue)


def _body(envelope: dict[str, Any]) -> str:
    import base64

    return base64.b64decode(envelope["body"]).decode()


def test_threads_publish_on_channels_of_their_own(app: Celery, broker: redis.Redis) -> None:
    queue = app.conf.task_default_queue
    dispatcher = CeleryDispatcher(app)
    channels: set[int] = set()

    def send(thread: int) -> None:
        for revision in range(50):
            dispatcher.phase("planning", f"s-{thread}", revision)
        channels.add(id(dispatcher.direct._local.channel))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent = [json.loads(_body(m))[0] for m in _queued(broker, queue)]
    assert len(channels) == 4
    for n in range(4):  # each thread's messages, all there, in its order
        assert [r for s, r in sent if s == f"s-{n}"] == list(range(50))
    broker.delete(queue)


def test_a_broker_outage_goes_to_send_task_and_the_short_path_comes_back(
    private_redis: PrivateRedis,
) -> None:
    broker_url = f"{private_redis.url}/0"
    app = make_app(make_settings("sqlite://", broker_url=broker_url, queue=uid("q")))
    dispatcher = CeleryDispatcher(app)
    queue, direct = app.conf.task_default_queue, dispatcher.direct
    assert direct.publish(PLANNING, ["s-1", 1], "")
    private_redis.stop()
    with pytest.raises(OperationalError):  # send_task's own error, after its retries
        dispatcher.phase("planning", "s-1", 2)
    assert direct._local.channel is None  # dropped, not reused
    private_redis.start()
    assert not direct.publish(PLANNING, ["s-1", 2], "")  # send_task's turn, for a while
    dispatcher.phase("planning", "s-1", 2)
    time.sleep(RETRY_DIRECT_AFTER_S)
    assert direct.publish(PLANNING, ["s-1", 3], "")  # on a new channel
    client = redis.Redis.from_url(broker_url)
    revisions = [json.loads(_body(json.loads(m)))[0][1] for m in client.lrange(queue, 0, -1)]
    assert sorted(revisions) == [2, 3]  # the first went down with the server
    client.close()
    app.close()
