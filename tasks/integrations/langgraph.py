"""A compiled LangGraph graph as an agentstate agent (``pip install
'agentstate-celery[langgraph]'``; named in AGENTSTATE_AGENTS, ``name=module:graph``).

A turn runs the graph in its ``executing`` phase (``tasks.agents.framework``), on the
session's LangGraph thread (``thread_id`` = the session id):

- from the session's last checkpoint, with the turn's message as ``{"messages":
  [HumanMessage]}``; checkpoints are written after every step (durability "sync") by
  :class:`~tasks.integrations.langgraph_saver.AgentstateSaver`, in agentstate's database;
- a turn run again because its worker died finds the last checkpoint written by its own
  run with steps still to do, and resumes it (input None): the steps done do not run again;
- ``interrupt(value)`` in a node parks the turn as an approval (``action`` = the node's
  name, ``args`` = ``{"value": value}``); the decision resumes the graph with
  ``Command(resume={"approved": bool, "note": note})``;
- message chunks (stream mode ``messages``: a chat model's tokens, or a message a node
  returns) and strings a node writes with ``get_stream_writer()`` are ``ctx.stream``
  chunks of the reply;
- the reply is the last AI message of the graph's ``messages``.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.types import Command, StateSnapshot

from config import Settings
from state.documents.codec import Document
from state.storage.backend import default_backend
from tasks.agents.registry import FrameworkTurn, TurnOutcome
from tasks.integrations.langgraph_saver import AgentstateSaver

STREAM_MODES = ["messages", "custom"]


class LangGraphAdapter:
    """Runs turns of one compiled graph (``tasks.agents.registry.FrameworkAdapter``)."""

    def __init__(self, graph: Any, name: str, settings: Settings) -> None:
        self.graph = graph
        self.name = name
        self.settings = settings

    def run_turn(self, turn: FrameworkTurn) -> TurnOutcome:
        """Run (or resume) the graph for ``turn``; its reply, or the approval it waits for."""
        ctx = turn.ctx
        engine = default_backend(self.settings).engine
        saver = AgentstateSaver(engine, message_id=ctx.message_id)
        graph = self.graph.copy(update={"checkpointer": saver})
        config: Any = {"configurable": {"thread_id": ctx.session_id}}
        graph_input: Any
        if turn.decision is not None:
            decision = {
                "approved": bool(turn.decision.get("approved")),
                "note": turn.decision.get("note"),
            }
            graph_input = Command(resume=decision)
        elif saver.latest_turn(ctx.session_id) == ctx.message_id and _unfinished(graph, config):
            graph_input = None  # this turn's own run, cut short: go on from its checkpoint
        else:
            graph_input = {"messages": [HumanMessage(content=ctx.message, id=ctx.message_id)]}
        for mode, chunk in graph.stream(
            graph_input, config, stream_mode=STREAM_MODES, durability="sync"
        ):
            text = _chunk_text(mode, chunk)
            if text:
                ctx.stream(text)
        state: StateSnapshot = graph.get_state(config)
        asked = _interrupt(state)
        if asked is not None:
            return TurnOutcome(approval=asked)
        return TurnOutcome(reply=_last_ai_text(state.values))


def make_adapter(obj: Any, name: str, settings: Settings) -> LangGraphAdapter:
    """The adapter of a compiled graph (``tasks.agents.registry``'s extension point)."""
    return LangGraphAdapter(obj, name, settings)


def _unfinished(graph: Any, config: Any) -> bool:
    state: StateSnapshot = graph.get_state(config)
    return bool(state.next) and not state.interrupts


def _chunk_text(mode: str, chunk: Any) -> str:
    if mode == "custom":
        return chunk if isinstance(chunk, str) else ""
    message = chunk[0] if isinstance(chunk, tuple) else chunk
    if isinstance(message, BaseMessage) and message.type in ("ai", "AIMessageChunk"):
        return _text(message.content)
    return ""


def _interrupt(state: StateSnapshot) -> Document | None:
    for task in state.tasks:
        for pending in task.interrupts:
            return {"action": task.name, "args": {"value": _json_ready(pending.value)}}
    return None


def _json_ready(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _last_ai_text(values: Any) -> str | None:
    messages = values.get("messages") if isinstance(values, dict) else None
    for message in reversed(messages or []):
        if isinstance(message, BaseMessage) and message.type == "ai":
            return _text(message.content)
        if isinstance(message, dict) and message.get("role") in ("assistant", "ai"):
            return _text(message.get("content"))
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part if isinstance(part, str) else str(part.get("text", ""))
            for part in content
            if isinstance(part, str | dict)
        )
    return ""
