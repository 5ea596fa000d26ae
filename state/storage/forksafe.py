"""Connection pools across ``fork()``.

An app that builds an AgentClient at import time, under a pre-fork server (gunicorn
--preload, a Celery prefork pool, multiprocessing), forks with open pooled connections.
A child that used them would share the parent's sockets: interleaved protocol messages,
results read by the wrong process, sessions read back as None. After a fork the child
therefore starts every engine with an empty pool.

redis-py pools need nothing: they compare ``os.getpid()`` on every checkout and start
afresh in a child. The Celery side (broker connection pools) is in ``tasks.app``.
"""

from __future__ import annotations

import os
import weakref

from sqlalchemy import Engine

_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def track_engine(engine: Engine) -> Engine:
    """Give ``engine`` an empty pool in every child forked from now on."""
    _engines.add(engine)
    return engine


def _empty_pools_in_child() -> None:
    for engine in list(_engines):
        # close=False (SQLAlchemy's recipe for fork): the parent's connections are left
        # alone, not closed, so the parent keeps using them; the child connects anew.
        # psycopg2 does not close a connection garbage-collected in another process.
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_empty_pools_in_child)
