"""A LangGraph project's graph, loaded from its file as langgraph.json names it."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph


def reply(state: MessagesState) -> dict[str, Any]:
    humans = [m for m in state["messages"] if isinstance(m, HumanMessage)]
    return {"messages": [AIMessage(f"project says: {humans[-1].content}")]}


builder = StateGraph(MessagesState)
builder.add_node("reply", reply)
builder.add_edge(START, "reply")
builder.add_edge("reply", END)
graph = builder.compile()
