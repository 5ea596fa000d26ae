"""LangGraph graphs (plain Python nodes, no model) that tests run as agents, through
AGENTSTATE_AGENTS (``echo=tests.graphs:echo``, ...).

- ``echo``: one node that streams two chunks (``get_stream_writer``) and answers
  ``echo: <message> (#n)``, n counting the human messages of the thread so far;
- ``steps``: three nodes, ``first`` -> ``slow`` -> ``last``, each counting its runs in Redis
  (``runs_key``); ``slow`` takes SLOW_S when the message says "linger" (a window to kill
  its worker), so a resumed run shows which nodes ran again;
- ``approve``: ``ask`` calls ``interrupt({"amount": 5})`` and answers with the decision.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt

from config import get_settings
from state.storage.redis_client import get_redis

SLOW_S = 4.0


def runs_key(session_id: str, node: str) -> str:
    """The Redis counter of a node's runs for a session."""
    return f"test:lg:{session_id}:{node}"


def _count(config: RunnableConfig, node: str) -> None:
    session_id = str(config["configurable"]["thread_id"])
    get_redis(get_settings().redis_url).incr(runs_key(session_id, node))


def _last_human(state: MessagesState) -> str:
    humans = [m for m in state["messages"] if isinstance(m, HumanMessage)]
    return str(humans[-1].content) if humans else ""


def _answer(state: MessagesState) -> dict[str, Any]:
    writer = get_stream_writer()
    writer("echo")
    writer(": ")
    humans = sum(isinstance(m, HumanMessage) for m in state["messages"])
    return {"messages": [AIMessage(f"echo: {_last_human(state)} (#{humans})")]}


def _first(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    _count(config, "first")
    return {"messages": [AIMessage("first done")]}


def _slow(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    _count(config, "slow")
    if "linger" in _last_human(state):
        time.sleep(SLOW_S)
    return {"messages": [AIMessage("slow done")]}


def _last(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    _count(config, "last")
    return {"messages": [AIMessage(f"all steps done for {_last_human(state)}")]}


def _ask(state: MessagesState) -> dict[str, Any]:
    decision = interrupt({"amount": 5})
    verdict = "approved" if decision.get("approved") else "rejected"
    return {"messages": [AIMessage(f"transfer {verdict} ({decision.get('note')})")]}


def _build_echo() -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("answer", _answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


def _build_steps() -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("first", _first)
    graph.add_node("slow", _slow)
    graph.add_node("last", _last)
    graph.add_edge(START, "first")
    graph.add_edge("first", "slow")
    graph.add_edge("slow", "last")
    graph.add_edge("last", END)
    return graph.compile()


def _build_approve() -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("ask", _ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile()


echo = _build_echo()
steps = _build_steps()
approve = _build_approve()
