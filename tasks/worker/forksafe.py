"""Celery's broker connection pools across ``fork()`` (the engines' side is
``state.storage.forksafe``).

Celery resets an app's pools in the children billiard or multiprocessing start, but not
in plain ``os.fork()`` children (gunicorn --preload, any pre-fork server): those would
publish through the parent's pooled broker connections, with AMQP on the parent's very
TCP socket. After a fork the child therefore starts with empty broker pools.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from celery import Celery
from kombu import pools

_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
# Dropped but kept alive, never closed: closing, or garbage-collecting, an AMQP
# connection in the child would shut down the socket it shares with the parent.
_inherited: list[Any] = []


def track_app(app: Celery) -> Celery:
    """Give ``app`` empty broker pools in every child forked from now on."""
    _apps.add(app)
    return app


def _empty_broker_pools_in_child() -> None:
    # kombu's pool groups are process-global, keyed by broker URL: a new app.pool would
    # find the parent's pool there again.
    for group in (pools.connections, pools.producers):
        _inherited.extend(group.values())
        group.clear()
    for app in list(_apps):
        _inherited.append(app._pool)
        app._after_fork()  # Celery's own reset of app.pool and app.amqp.producer_pool


os.register_at_fork(after_in_child=_empty_broker_pools_in_child)
