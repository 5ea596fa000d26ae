"""The six-node graph of ``bench.langgraph_baseline`` for LangGraph's own dev server
(``langgraph-api``), which brings its own in-memory checkpointer: loaded by that server,
in its own virtualenv, so it imports nothing but ``langgraph``."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

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


def _build() -> Any:
    graph = StateGraph(TurnState)
    previous = START
    for phase in PHASES:
        graph.add_node(phase, _node(phase))
        graph.add_edge(previous, phase)
        previous = phase
    graph.add_edge(previous, END)
    return graph.compile()


graph = _build()
