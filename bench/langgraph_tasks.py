"""LangGraph on Celery: one task per turn runs the six-node PostgresSaver graph.

Workers load this module with ``AGENTSTATE_ACTION_MODULES=bench.langgraph_tasks``: the
worker's main process imports LangGraph when it starts, and each pool child builds its
graph and connection pool when it starts (``worker_process_init``), never in a task.
A session's turns run one after another, as agentstate's do: each task runs one turn
and then enqueues the session's next one.
"""

from __future__ import annotations

from typing import Any

from celery.signals import worker_process_init

from bench.langgraph_baseline import invoke_turn, open_graph
from state.storage import keys
from tasks.app import app
from tasks.worker.guard import GUARD_STRATEGY

_graph: list[Any] = []


def _url() -> str:
    from config import get_settings

    return get_settings().database_url.replace("postgresql+psycopg2://", "postgresql://")


@worker_process_init.connect
def _build_at_start(**_: object) -> None:
    _graph[:] = [open_graph(_url())[0]]


def graph() -> Any:
    """This process's graph (built at start; solo and thread pools build it on first use)."""
    if not _graph:
        _build_at_start()
    return _graph[0]


TURN = "agentstate.bench.langgraph_turn"


@app.task(name=TURN, bind=True, acks_late=True, Strategy=GUARD_STRATEGY)
def langgraph_turn(self: Any, thread_id: str, turn: int, turns: int, counter: str) -> None:
    """Run turn ``turn`` of ``thread_id``; enqueue the next, or count the session done."""
    invoke_turn(graph(), thread_id, f"hello number {turn}")
    if turn + 1 < turns:
        self.app.send_task(TURN, args=[thread_id, turn + 1, turns, counter])
    else:
        from config import get_settings
        from state.storage.redis_client import get_redis

        get_redis(get_settings().redis_url).incr(keys.baseline_counter(counter))
