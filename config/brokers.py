"""What each kind of broker needs from Celery: one class per kind, chosen by URL scheme.

- Redis (``redis://``, ``rediss://``): kombu's Redis transport with one client per
  channel (``tasks/dispatch/transport.py``).
- Redis Sentinel (``redis+sentinel://``): the same transport on kombu's sentinel
  channel, which asks the Sentinels for the current primary on every (re)connect.
- RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``): a durable queue, quorum by default
  (``AGENTSTATE_BROKER_QUEUE_TYPE``), on a topic exchange so that countdowns use
  RabbitMQ's native delayed delivery instead of waiting in a worker's memory, and
  publisher confirms: a publish returns once the broker has the message.
"""

from __future__ import annotations

import math
from typing import Any

from kombu.entity import Exchange, Queue

from config.sentinel import SentinelURL
from config.settings import QueueType, Settings


class Broker:
    """A broker kombu knows by its URL alone."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def options(self) -> dict[str, Any]:
        """The Celery settings for this broker."""
        return {
            "broker_url": self.settings.broker_url,
            "broker_transport_options": {"visibility_timeout": self.settings.visibility_timeout_s},
            "task_queues": self.queues(),
        }

    def queues(self) -> list[Queue]:
        """The turns' queue and the steps' queue (each on a direct exchange of its name,
        as Celery declares a queue by default)."""
        return [
            Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]
            for name in (self.settings.queue, self.settings.step_queue)
        ]

    def countdown(self, seconds: float) -> float:
        """The countdown to send for a task due in ``seconds``."""
        return seconds


# kombu's Redis transport minus a per-publish cost (tasks/dispatch/transport.py), per URL scheme;
# rediss:// gets a subclass of its own so that Flower still sees the TLS scheme.
REDIS_TRANSPORTS = {
    "redis": "tasks.dispatch.transport:Transport",
    "rediss": "tasks.dispatch.transport:TlsTransport",
}


class RedisBroker(Broker):
    """Redis, through kombu's transport minus a per-publish client."""

    @property
    def transport(self) -> str:
        """Our transport for the URL's scheme."""
        return REDIS_TRANSPORTS[self.settings.broker_url.split("://", 1)[0].lower()]

    def options(self) -> dict[str, Any]:
        """Celery's settings, on our transport. A worker consuming both queues asks for
        them in sorted order (BRPOP takes from the first non-empty list): turns first."""
        options = super().options()
        transport_options = {
            **options["broker_transport_options"],
            "queue_order_strategy": "sorted",
        }
        return {
            **options,
            "broker_transport": self.transport,
            "broker_transport_options": transport_options,
        }


class SentinelBroker(RedisBroker):
    """Redis behind Sentinel: the primary is looked up on each connect, so a failover
    costs a reconnect (and the messages the old primary had not replicated: the
    recovery sweep re-enqueues their work)."""

    @property
    def transport(self) -> str:
        """Our transport on kombu's sentinel channel."""
        return "tasks.dispatch.transport:SentinelTransport"

    def options(self) -> dict[str, Any]:
        """The ``sentinel://`` URLs kombu reads, and the monitored service's name."""
        url = SentinelURL.parse(self.settings.broker_url)
        options = super().options()
        transport_options = {**options["broker_transport_options"], "master_name": url.service}
        return {
            **options,
            "broker_url": url.kombu_url(),
            "broker_transport_options": transport_options,
        }


class AmqpBroker(Broker):
    """RabbitMQ with a classic durable queue (for brokers without quorum queues)."""

    queue_arguments: dict[str, Any] | None = None

    def options(self) -> dict[str, Any]:
        """A durable queue on a topic exchange of the same name, publisher confirms."""
        name = self.settings.queue
        exchange = Exchange(name, type="topic", durable=True)  # type: ignore[no-untyped-call]
        # Steps have their own queue on the same exchange (their routing key is its name).
        queues = [
            Queue(  # type: ignore[no-untyped-call]
                queue,
                exchange,
                routing_key=queue,
                durable=True,
                queue_arguments=self.queue_arguments,
            )
            for queue in (name, self.settings.step_queue)
        ]
        options = super().options()
        transport_options = {**options["broker_transport_options"], "confirm_publish": True}
        return {
            **options,
            "broker_transport_options": transport_options,
            "task_queues": queues,
            "task_default_exchange_type": "topic",
        }


class QuorumAmqpBroker(AmqpBroker):
    """RabbitMQ with a quorum queue: replicated, durable, and redelivery-counted.

    Quorum queues have no global QoS (Celery switches to per-consumer prefetch by itself,
    ``worker_detect_quorum_queues``), and their countdowns travel through RabbitMQ's
    delayed-delivery queues, which count whole seconds only.
    """

    queue_arguments = {"x-queue-type": "quorum"}

    def countdown(self, seconds: float) -> float:
        """Rounded up to whole seconds: never early, and never below Celery's one
        second (a shorter native delay is refused outright)."""
        return float(math.ceil(seconds)) if seconds > 0 else seconds


_AMQP = {QueueType.QUORUM: QuorumAmqpBroker, QueueType.CLASSIC: AmqpBroker}


def broker_for(settings: Settings) -> Broker:
    """The broker profile for ``settings.broker_url``."""
    scheme = settings.broker_url.split("://", 1)[0].lower()
    if scheme in ("amqp", "amqps", "pyamqp"):
        return _AMQP[settings.broker_queue_type](settings)
    kinds: dict[str, type[Broker]] = {
        "redis": RedisBroker,
        "rediss": RedisBroker,
        "redis+sentinel": SentinelBroker,
    }
    return kinds.get(scheme, Broker)(settings)
