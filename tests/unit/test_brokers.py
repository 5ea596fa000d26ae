"""Broker profiles (config/brokers.py) and redis+sentinel:// URLs (config/sentinel.py)."""

from __future__ import annotations

import pytest

from config import Settings
from config.brokers import (
    AmqpBroker,
    QuorumAmqpBroker,
    RedisBroker,
    SentinelBroker,
    broker_for,
)
from config.celery import celery_config
from config.sentinel import SentinelURL
from config.settings import QueueType
from state.errors import BadInputError, ConfigurationError


def _settings(broker_url: str, **values: object) -> Settings:
    return Settings(broker_url=broker_url, redis_url="redis://localhost:6379/0", **values)


def test_each_scheme_gets_its_profile() -> None:
    assert type(broker_for(_settings("redis://r:6379/1"))) is RedisBroker
    assert type(broker_for(_settings("rediss://r:6380/1"))) is RedisBroker
    assert type(broker_for(_settings("redis+sentinel://s:26379/svc"))) is SentinelBroker
    assert type(broker_for(_settings("amqp://u:p@rabbit//"))) is QuorumAmqpBroker
    classic = _settings("amqps://rabbit//", broker_queue_type=QueueType.CLASSIC)
    assert type(broker_for(classic)) is AmqpBroker


def test_redis_keeps_its_transport_and_visibility_timeout() -> None:
    config = celery_config(_settings("redis://r:6379/1"))
    assert config["broker_url"] == "redis://r:6379/1"
    assert config["broker_transport"] == "tasks.dispatch.transport:Transport"
    assert config["broker_transport_options"]["visibility_timeout"] >= 3600
    # Turns and steps have queues of their own; a worker asks for them in sorted order
    # (BRPOP takes from the first non-empty list): turns first.
    assert [q.name for q in config["task_queues"]] == ["agentstate", "agentstate.steps"]
    assert config["broker_transport_options"]["queue_order_strategy"] == "sorted"
    assert sorted(q.name for q in config["task_queues"])[0] == config["task_default_queue"]


def test_sentinel_becomes_kombus_sentinel_urls_and_master_name() -> None:
    config = celery_config(_settings("redis+sentinel://:s3cret@a:26379,b:26380,c/agents/2"))
    assert config["broker_url"] == (
        "sentinel://:s3cret@a:26379/2;sentinel://:s3cret@b:26380/2;sentinel://:s3cret@c:26379/2"
    )
    assert config["broker_transport"] == "tasks.dispatch.transport:SentinelTransport"
    assert config["broker_transport_options"]["master_name"] == "agents"


def test_rabbitmq_gets_a_durable_quorum_queue_on_a_topic_exchange() -> None:
    settings = _settings("amqp://rabbit//", queue="work")
    config = celery_config(settings)
    queue, steps = config["task_queues"]
    assert steps.name == "work.steps" and steps.routing_key == "work.steps"
    assert steps.exchange == queue.exchange
    assert queue.name == "work" and queue.durable
    assert queue.queue_arguments == {"x-queue-type": "quorum"}
    assert queue.exchange.type == "topic" and queue.routing_key == "work"
    assert config["broker_transport_options"]["confirm_publish"] is True
    assert "broker_transport" not in config
    classic = celery_config(_settings("amqp://rabbit//", broker_queue_type=QueueType.CLASSIC))
    assert classic["task_queues"][0].queue_arguments is None


def test_quorum_countdowns_are_whole_seconds_never_early() -> None:
    # Celery's native delayed delivery refuses a delay under one second outright.
    quorum = broker_for(_settings("amqp://rabbit//"))
    assert [quorum.countdown(s) for s in (0.05, 1.0, 1.2, 30.0)] == [1.0, 1.0, 2.0, 30.0]
    assert quorum.countdown(0.0) == 0.0
    assert broker_for(_settings("redis://r//")).countdown(0.05) == 0.05


def test_sentinel_url_parts() -> None:
    url = SentinelURL.parse("redis+sentinel://user:p%40ss@[::1]:26379,h2:1/my%20svc")
    assert url.sentinels == (("::1", 26379), ("h2", 1))
    assert (url.service, url.db, url.username, url.password) == ("my svc", 0, "user", "p@ss")
    assert url.kombu_url() == "sentinel://user:p%40ss@[::1]:26379/0;sentinel://user:p%40ss@h2:1/0"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis+sentinel://:pw@/svc", "names no Sentinel host"),
        ("redis+sentinel://:pw@h:1", "service name"),
        ("redis+sentinel://:pw@h:1/svc/x", "database must be a number"),
        ("redis+sentinel://:pw@h:port/svc", "bad Sentinel port"),
        ("redis://:pw@h:1/0", r"not a redis\+sentinel"),
    ],
)
def test_bad_sentinel_urls_are_one_clear_error_without_the_password(url: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words) as refused:
        SentinelURL.parse(url)
    assert isinstance(refused.value, BadInputError)
    assert "pw" not in str(refused.value)
