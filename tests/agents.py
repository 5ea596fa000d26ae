"""A test agent: the reference agent, plus handlers that fail or overrun on request.

Workers load it with AGENTSTATE_AGENT=tests.agents. A message containing "explode" makes
planning raise; "dawdle" makes executing sleep past a 1 s deadline; "linger" makes it
take LINGER_S (a window for killing or stopping the worker mid-phase); "unstorable"
makes executing return a user-state change that raises when the engine commits it;
"slowflow" makes executing wait for a workflow whose one step sleeps 3 s; "narrate" makes
executing emit two events of its own, and "misnarrate" emits one and then one with a kind
reserved for agentstate (which fails the phase).
"""

from __future__ import annotations

import time

from state.agent import PhaseContext, PhaseResult
from tasks import agent as reference
from tasks.agent import evaluating, generating, retrieving, understanding

__all__ = ["evaluating", "executing", "generating", "planning", "retrieving", "understanding"]

DAWDLE_S = 3.0
SLOW_WORKFLOW = {"steps": [{"step_id": "slow", "action": "sleep", "inputs": {"seconds": 3}}]}
LINGER_S = 2.0


def planning(ctx: PhaseContext) -> PhaseResult:
    if "explode" in ctx.message:
        raise RuntimeError("the planner exploded on purpose")
    return reference.planning(ctx)


def executing(ctx: PhaseContext) -> PhaseResult:
    if "dawdle" in ctx.message:
        time.sleep(DAWDLE_S)
    elif "linger" in ctx.message:
        time.sleep(LINGER_S)
    elif "unstorable" in ctx.message:
        return PhaseResult("tools_complete", user_state=_broken_change)
    elif "narrate" in ctx.message:
        ctx.emit("tool.called", {"tool": "calculator", "attempt": ctx.attempt})
        if "misnarrate" in ctx.message:
            ctx.emit("reply", {"text": "forged"})
        ctx.emit("tool.done")
    elif "slowflow" in ctx.message:
        if ctx.workflow is None:
            return PhaseResult(None, workflow=SLOW_WORKFLOW)
        return PhaseResult("tools_complete", tool_results=[{"workflow": ctx.workflow["status"]}])
    return reference.executing(ctx)


def _broken_change(state: dict[str, object]) -> dict[str, object]:
    raise ZeroDivisionError("the user-state change divided by zero")
