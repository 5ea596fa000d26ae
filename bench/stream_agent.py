"""The agent of the chunks/s row: the reference agent, whose ``generating`` streams
``CHUNKS`` chunks as fast as it can before its reply (``AGENTSTATE_AGENT=bench.stream_agent``)."""

from __future__ import annotations

from state.agent import PhaseContext, PhaseResult
from tasks.agent import evaluating, executing, planning, retrieving, understanding

__all__ = ["evaluating", "executing", "generating", "planning", "retrieving", "understanding"]

CHUNKS = 400
CHUNK = "token "


def generating(ctx: PhaseContext) -> PhaseResult:
    for _ in range(CHUNKS):
        ctx.stream(CHUNK)
    return PhaseResult("response_sent", reply=CHUNK * CHUNKS)
