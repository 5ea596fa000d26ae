"""The LangGraph baseline: a six-node graph checkpointed by PostgresSaver with
``durability="sync"`` (each node's checkpoint is committed before the next node runs,
like agentstate's one durable checkpoint per phase).

    python -m bench.langgraph_baseline setup
    python -m bench.langgraph_baseline run PREFIX SESSIONS TURNS_PER_SESSION
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from bench.harness import BENCH_DB, PG_SERVER

URL = PG_SERVER.replace("postgresql+psycopg2://", "postgresql://") + f"/{BENCH_DB}"
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
    graph = StateGraph(TurnState)
    previous = START
    for phase in PHASES:
        graph.add_node(phase, _node(phase))
        graph.add_edge(previous, phase)
        previous = phase
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=checkpointer)


def main(argv: list[str]) -> None:
    with PostgresSaver.from_conn_string(URL) as checkpointer:
        if argv[0] == "setup":
            checkpointer.setup()
            return
        prefix, sessions, turns = argv[1], int(argv[2]), int(argv[3])
        graph = build(checkpointer)
        for k in range(turns):
            for i in range(sessions):
                graph.invoke(
                    {"messages": [{"role": "user", "content": f"hello number {k}"}]},
                    {"configurable": {"thread_id": f"{prefix}-{i}"}},
                    durability="sync",
                )


if __name__ == "__main__":
    main(sys.argv[1:])
