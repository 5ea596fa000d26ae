"""The direct publisher: agentstate's own messages (the next phase, a workflow step, a
client's kick) handed to a kombu channel the process keeps, instead of going through
``Celery.send_task``.

On the Redis brokers, ``send_task`` costs about three times the broker's own work: it
looks the task up, routes it, checks out a pooled producer, wraps the publish in
kombu's retry machinery and builds a result object nobody reads. A phase pays that on
every hop. This publisher builds the same message (Celery's protocol 2, by Celery's own
``as_task_v2``, with the parent and root ids Flower shows) and publishes it on the
channel directly: what lands on the queue is what ``send_task`` would put there, but
for the per-message ids.

It steps aside, and ``send_task`` sends the message, whenever the short path would
change what a user sees:

- when the broker is not Redis (RabbitMQ's publisher confirms stay with kombu);
- when ``task_routes`` is set or the task has routing options of its own (a router may
  look at anything), or a ``before_task_publish``/``after_task_publish`` receiver is
  connected (tracing and monitoring hook in there);
- for a delayed message (a countdown: Celery computes its ETA);
- when the publish fails: the channel is dropped and ``send_task`` retries the message
  with its own policy. A message that reached Redis before the failure may then arrive
  twice, as with any at-least-once send: a repeated delivery is dropped by the revision
  it carries.

Each thread has a channel of its own (a kombu channel is not thread-safe), opened on its
first send and again after a fork (the parent's socket is never used in the child).
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from typing import Any

from celery import Celery, signals
from celery.utils.nodenames import anon_nodename
from kombu.serialization import dumps
from kombu.transport import redis as kombu_redis
from kombu.utils import json as kombu_json
from kombu.utils.encoding import str_to_bytes
from kombu.utils.uuid import uuid

logger = logging.getLogger(__name__)

# How long a thread leaves the broker to send_task after a failed direct publish.
RETRY_DIRECT_AFTER_S = 1.0
_DELIVERY_MODES = {"persistent": 2, "transient": 1}
# Task options that send its messages elsewhere or change them: such a task takes
# send_task's path.
_ROUTING_OPTIONS = ("queue", "exchange", "routing_key", "priority", "expires")
_WATCHED = (signals.before_task_publish, signals.after_task_publish)
# When the message was sent: the recovery sweep reads it off the oldest message still
# queued, and leaves alone work sent after it (still queued, not lost).
SENT_HEADER = "agentstate_sent"


def sent_at() -> str:
    """The value of SENT_HEADER for a message sent now."""
    return f"{time.time():.3f}"


class _KombuMessages:
    """The message dict of kombu's virtual channels (``Channel.prepare_message``), built
    without a channel."""

    @staticmethod
    def prepare_message(*parts: Any) -> dict[str, Any]:
        """(body, priority, content_type, content_encoding, headers, properties), as
        kombu's channel takes them."""
        body, priority, content_type, content_encoding, headers, properties = parts
        properties = properties or {}
        properties.setdefault("delivery_info", {})
        properties.setdefault("priority", priority or 0)
        return {
            "body": body,
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers or {},
            "properties": properties,
        }


class DirectPublisher:
    """Sends agentstate messages on a channel of this thread's own (module docstring)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._local = threading.local()
        # (queue name, delivery mode) once the short path is known to apply; None if it
        # does not (decided on first use, from the app's configuration and transport).
        self._route: tuple[str, int] | None = None
        self._decided = False
        self._options: dict[str, tuple[float | None, float | None] | None] = {}

    def publish(
        self,
        name: str,
        args: list[Any],
        argsrepr: str,
        queue: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> bool:
        """Send task ``name`` with ``args`` to ``queue`` (default: the app's default
        queue), with extra message ``headers`` (the trace context); False if it must go
        through ``send_task`` instead (see the module
        docstring), having sent nothing."""
        if any(signal.receivers for signal in _WATCHED) or self._resting():
            return False
        try:
            channel = self._channel()
            limits = self._limits(name)
            if channel is None or self._route is None or limits is None:
                return False
            routing_key = self._route[0] if queue is None else self._declared(queue)
            if routing_key is None:
                return False
            message = self._message(channel, limits, name, args, argsrepr, extra_headers=headers)
            # Straight to the queue, as Celery's send does for a direct exchange.
            channel.basic_publish(message, exchange="", routing_key=routing_key)
        except Exception as exc:  # the broker went away: send_task reconnects and retries
            logger.debug("direct publish of %s failed, handing it to send_task: %r", name, exc)
            self._drop()
            # Until then send_task alone deals with the broker, at its own retry pace: an
            # outage costs each thread one failed attempt here per interval, not per send.
            self._local.resume_at = time.monotonic() + RETRY_DIRECT_AFTER_S
            return False
        return True

    def redis_message(
        self,
        name: str,
        args: list[Any],
        argsrepr: str,
        headers: dict[str, str] | None = None,
    ) -> tuple[str, str] | None:
        """The Redis list and the message ``publish`` would push there (the message kombu's
        Redis channel writes: body in base64, its delivery tag and info), for a caller
        that pushes it itself (the asyncio client, on its own connection); None where
        ``send_task`` must send it (module docstring). No I/O."""
        if any(signal.receivers for signal in _WATCHED):
            return None
        if not self._decided:
            self._route, self._decided = self._decide(), True
        limits = self._limits(name)
        if self._route is None or limits is None:
            return None
        if getattr(self._local, "pid", None) != os.getpid():
            self._local.pid, self._local.connection, self._local.channel = os.getpid(), None, None
            self._local.origin = anon_nodename()
        message = self._message(_KombuMessages, limits, name, args, argsrepr, extra_headers=headers)
        queue = self._route[0]
        body = str_to_bytes(message["body"])  # type: ignore[no-untyped-call]
        message["body"] = base64.b64encode(body).decode("ascii")
        properties = message["properties"]
        properties.update(body_encoding="base64", delivery_tag=uuid())
        properties["delivery_info"].update(exchange="", routing_key=queue)
        return queue, kombu_json.dumps(message)  # type: ignore[no-untyped-call]

    def _declared(self, queue: str) -> str | None:
        """``queue`` if the app declares it on a direct exchange of its own name (so that
        a push onto the list of that name is what Celery's routing would do), else None."""
        declared = self.app.amqp.queues.get(queue)
        if declared is None or declared.exchange.type != "direct":
            return None
        if declared.routing_key != queue or declared.exchange.name not in ("", queue):
            return None
        return queue

    def _resting(self) -> bool:
        return time.monotonic() < getattr(self._local, "resume_at", 0.0)

    def _message(
        self,
        channel: Any,
        limits: tuple[float | None, float | None],
        name: str,
        args: list[Any],
        argsrepr: str,
        *,
        extra_headers: dict[str, str] | None = None,
    ) -> Any:
        assert self._route is not None
        parent = self.app.current_worker_task  # None in a client: the message is a root
        request = parent.request if parent is not None else None
        headers, properties, body, _ = self.app.amqp.as_task_v2(
            uuid(),
            name,
            args,
            {},
            reply_to=self.app.thread_oid,
            root_id=request and (request.root_id or request.id),
            parent_id=request and request.id,
            origin=self._local.origin,
            ignore_result=None,
            argsrepr=argsrepr,
            kwargsrepr="{}",
            time_limit=limits[0],
            soft_time_limit=limits[1],
        )
        if extra_headers:
            headers.update(extra_headers)  # as send_task(headers=...) adds them
        headers[SENT_HEADER] = sent_at()
        # Celery copies these into the properties too; so do we, byte for byte.
        properties.update(argsrepr=argsrepr, kwargsrepr="{}")
        content_type, content_encoding, data = dumps(body, serializer="json")  # type: ignore[no-untyped-call]
        properties["delivery_mode"] = self._route[1]
        return channel.prepare_message(data, 0, content_type, content_encoding, headers, properties)

    def _limits(self, name: str) -> tuple[float | None, float | None] | None:
        """The time limits ``send_task`` would put in the message for task ``name`` (from
        its options), or None if its options route it elsewhere."""
        if name not in self._options:
            task = self.app.tasks.get(name)
            options = task._get_exec_options() if task is not None else {}
            routed = any(options.get(key) for key in _ROUTING_OPTIONS)
            limits = (options.get("time_limit"), options.get("soft_time_limit"))
            self._options[name] = None if routed else limits
        return self._options[name]

    def _channel(self) -> Any:
        """This thread's channel (opened on first use, again after a fork or a failure),
        or None where the short path does not apply."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            # Inherited across a fork: the parent's socket is not ours to use or close.
            local.pid, local.connection, local.channel = os.getpid(), None, None
            local.origin = anon_nodename()
        if not self._decided:
            self._route, self._decided = self._decide(), True
        if local.channel is None and self._route is not None:
            connection = self.app.connection_for_write()
            # One attempt (kombu's channel would retry for seconds): a broker that does
            # not answer sends this message to send_task and its bounded retry policy.
            connection.ensure_connection(max_retries=0)
            local.connection, local.channel = connection, connection.default_channel
        return local.channel

    def _decide(self) -> tuple[str, int] | None:
        conf = self.app.conf
        queue = self.app.amqp.queues.get(conf.task_default_queue)
        if conf.task_routes or queue is None or queue.exchange.type != "direct":
            return None
        with self.app.connection_for_write() as connection:  # not connected: no I/O
            if not isinstance(connection.transport, kombu_redis.Transport):
                return None
        mode = queue.exchange.delivery_mode or conf.task_default_delivery_mode
        return queue.name, int(_DELIVERY_MODES.get(mode, mode))

    def _drop(self) -> None:
        local = self._local
        connection, local.connection, local.channel = local.connection, None, None
        if connection is not None:
            try:
                connection.release()
            except Exception:  # already broken: nothing left to close cleanly
                logger.debug("closing a failed channel", exc_info=True)
