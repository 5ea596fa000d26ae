"""The LangGraph baseline: a six-node graph checkpointed by PostgresSaver with
``durability="sync"`` (each node's checkpoint is committed before the next node runs,
like agentstate's one durable checkpoint per phase).

Two shapes use it: in-process (:func:`prepare`, run by ``bench.warm`` in N processes) and
one Celery task per turn (``bench.langgraph_tasks``). Either way the graph and its
connection pool are built before the clock starts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from bench.warm import one_at_a_time

SETUP_LOCK = 7_401_001  # an advisory lock key of our own
PHASES = ("understanding", "planning", "retrieving", "executing", "evaluating", "generating")


class TurnState(TypedDict, total=False):
    messages: Annotated[list[dict[str, str]], operator.add]
    phase: str
    context: dict[str, Any]


def _node(phase: str) -> Any:
    def run(state: TurnState) -> dict[str, Any]:
        if phase == "generating":
            said = state["messages"][-1]["content"]
            return {
                "phase": phase,
                "messages": [{"role": "assistant", "content": f"You said {said}"}],
            }
        return {"phase": phase, "context": {**state.get("context", {}), phase: True}}

    return run


def build(checkpointer: PostgresSaver) -> Any:
    """The six-node graph, compiled with ``checkpointer``."""
    graph = StateGraph(TurnState)
    previous = START
    for phase in PHASES:
        graph.add_node(phase, _node(phase))
        graph.add_edge(previous, phase)
        previous = phase
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=checkpointer)


def open_graph(url: str) -> tuple[Any, ConnectionPool]:
    """The compiled graph on a pool of its own (one connection: one turn at a time)."""
    setup(url)
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=1,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    return build(PostgresSaver(pool)), pool


def invoke_turn(graph: Any, thread_id: str, text: str) -> None:
    """One turn: the user's message through the six nodes, each checkpoint committed."""
    graph.invoke(
        {"messages": [{"role": "user", "content": text}]},
        {"configurable": {"thread_id": thread_id}},
        durability="sync",
    )


def setup(url: str) -> None:
    """Create LangGraph's checkpoint tables if missing (every process may call it)."""
    with one_at_a_time(url, SETUP_LOCK), PostgresSaver.from_conn_string(url) as checkpointer:
        checkpointer.setup()


def prepare(
    url: str, prefix: str, sessions: int, turns: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Build the graph and pool, warm them with one turn; return the timed run."""
    graph, pool = open_graph(url)
    invoke_turn(graph, f"{prefix}-warm", "hello")

    def run() -> None:
        for k in range(turns):
            for i in range(sessions):
                invoke_turn(graph, f"{prefix}-{i}", f"hello number {k}")

    return run, pool.close
