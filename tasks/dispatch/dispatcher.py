"""The engines' Dispatcher, implemented with Celery messages."""

from __future__ import annotations

import json
from typing import Any

from amqp.exceptions import ChannelError
from celery import Celery

from config.brokers import Broker
from config.settings import STEP_QUEUE_SUFFIX
from tasks.dispatch.publisher import SENT_HEADER, DirectPublisher, sent_at
from tasks.observability import tracing

PHASE_TASK = "agentstate.phase.{}"
# Messages at a queue's oldest end looked at for our send time (past others' messages).
PEEK_MESSAGES = 16
TIMEOUT_TASK = "agentstate.session.timeout"
STEP_TASK = "agentstate.workflow.step"
WEBHOOK_TASK = "agentstate.webhooks.deliver"
_UNSET = object()


class CeleryDispatcher:
    """Sends agentstate tasks by name (the sender need not import the task modules)."""

    def __init__(self, app: Celery, broker: Broker | None = None) -> None:
        self.app = app
        # Countdowns are rounded to what the broker can delay by (whole seconds on
        # RabbitMQ quorum queues); None: sent as asked.
        self.broker = broker
        self.direct = DirectPublisher(app)
        self._step_queue: object = _UNSET

    def phase(
        self, phase: str, session_id: str, revision: int | None, carried: str | None = None
    ) -> None:
        """Enqueue ``agentstate.phase.<phase>`` (with the snapshot it continues from, if
        ``carried``: kept out of the arguments' repr, which logs and Flower show)."""
        name = PHASE_TASK.format(phase)
        if carried is None:
            self._send(name, [session_id, revision])
            return
        shown = repr([session_id, revision, f"<snapshot, {len(carried)} chars>"])
        self._send(name, [session_id, revision, carried], shown)

    def timeout(self, session_id: str, deadline: float, delay_s: float) -> None:
        """Enqueue the deadline check to run after ``delay_s`` seconds."""
        countdown = self._countdown(delay_s)
        self.app.send_task(
            TIMEOUT_TASK,
            args=[session_id, deadline],
            countdown=countdown,
            headers=tracing.headers(),
        )

    def step(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        delay_s: float = 0.0,
        carried: str | None = None,
    ) -> None:
        """Enqueue one workflow step delivery (with the step as a peek reads it, if
        ``carried``: shown shortened, like a phase's snapshot)."""
        countdown = self._countdown(delay_s) if delay_s > 0 else None
        args: list[Any] = [workflow_id, step_id, revision]
        # Steps have a queue of their own: a turn never waits behind them.
        queue = self.step_queue
        if carried is None:
            self._send(STEP_TASK, args, countdown=countdown, queue=queue)
            return
        shown = repr([*args, f"<step, {len(carried)} chars>"])
        self._send(STEP_TASK, [*args, carried], shown, countdown=countdown, queue=queue)

    def webhook(self, delivery_id: str, claim: str) -> None:
        """Enqueue one attempt of a webhook delivery under ``claim``, on the steps' queue:
        a slow receiver holds a step's worker, never a turn's."""
        self._send(WEBHOOK_TASK, [delivery_id, claim], queue=self.step_queue)

    @property
    def step_queue(self) -> str | None:
        """The steps' queue, where the app declares one (None: the default queue);
        looked up once."""
        if self._step_queue is _UNSET:
            queue = f"{self.app.conf.task_default_queue}{STEP_QUEUE_SUFFIX}"
            self._step_queue = queue if queue in self.app.amqp.queues else None
        return self._step_queue  # type: ignore[return-value]

    def _send(
        self,
        name: str,
        args: list[Any],
        shown: str | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> None:
        # Our arguments are a few ids and numbers (or a snapshot, shown shortened): their
        # repr is what Celery's bounded repr would make of them, at a fraction of its
        # cost, which every hop pays.
        argsrepr = repr(args) if shown is None else shown
        options = {key: value for key, value in options.items() if value is not None}
        # The trace context (AGENTSTATE_OTEL): the task's span joins the sender's trace.
        headers = tracing.headers()
        if not options and self.direct.publish(name, args, argsrepr, queue, headers):
            return
        if queue is not None:
            options["queue"] = queue
        options["headers"] = {**(headers or {}), SENT_HEADER: sent_at()}
        self.app.send_task(name, args=args, argsrepr=argsrepr, kwargsrepr="{}", **options)

    def _countdown(self, delay_s: float) -> float:
        return self.broker.countdown(delay_s) if self.broker is not None else delay_s

    def backlog(self) -> int | None:
        """Messages waiting in the queue (0 if it does not exist, None if unknown)."""
        queue = self.app.conf.task_default_queue
        try:
            with self.app.connection_for_write() as conn:
                declared = conn.default_channel.queue_declare(queue=queue, passive=True)
                return int(declared.message_count)
        except ChannelError:
            return 0
        except Exception:  # the broker is down or cannot tell: assume nothing
            return None

    def oldest_queued(self, steps: bool = False) -> float | None:
        """When the oldest of our messages waiting in the turns' (or steps') queue was
        sent; None if none waits, or the broker cannot tell (RabbitMQ cannot be looked
        into without taking messages: there the sweep backs off as before).

        On Redis a queue is a list, pushed on the left and popped on the right: the
        oldest messages are at its right end. Messages another sender put there without
        our header (beat's) are looked past, a few at most."""
        queue = (self.step_queue if steps else None) or self.app.conf.task_default_queue
        try:
            with self.app.connection_for_read() as conn:
                if conn.transport.driver_type != "redis":
                    return None  # not looked into (and not connected to) at all
                client = getattr(conn.default_channel, "client", None)
                if client is None or not hasattr(client, "lrange"):
                    return None
                oldest = client.lrange(queue, -PEEK_MESSAGES, -1)
        except Exception:  # the broker is down or is not Redis: assume nothing
            return None
        for raw in reversed(oldest):
            try:
                sent = json.loads(raw).get("headers", {}).get(SENT_HEADER)
                return float(sent)
            except (ValueError, TypeError, AttributeError):
                continue
        return None
