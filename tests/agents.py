"""A test agent: the reference agent, plus handlers that fail or overrun on request.

Workers load it with AGENTSTATE_AGENT=tests.agents. A message containing "stumble" makes
understanding raise; "explode" makes planning raise; "dawdle" makes executing sleep past
a 1 s deadline; "linger" makes it take LINGER_S (a window for killing or stopping the
worker mid-phase); "straggle" makes it take STRAGGLE_S (long enough to partition the
worker away and let another finish the turn); "unstorable" makes executing return a
user-state change that raises when the engine commits it; "slowflow" makes executing wait
for a workflow whose one step sleeps 3 s; "vanish" makes planning end its worker process
on the spot (counting each run in Redis, see ``vanish_key``); "ponder" makes planning take
PONDER_S, and "hang" makes retrieving take HANG_S (past a small
AGENTSTATE_PHASE_TIME_LIMIT); "narrate" makes executing emit two events of its own, and
"misnarrate" emits one and then one with a kind reserved for agentstate (which fails the
phase). "risky" makes planning ask for approval of the action "risky" ("hasty": with a 1 s
``ttl_s``); once approved, executing counts each run in Redis (``risky_key``) and, in the
user's state, ``risky_runs`` (with "linger", taking LINGER_S: a window for a SIGKILL).
"hold" makes executing wait (at most HOLD_S) until the test sets ``release_key``: a turn
surely running while a slow caller (a command's start) acts on it.
"trickle" makes generating stream TRICKLE_CHUNKS chunks, TRICKLE_PAUSE_S apart, and reply
with them joined ("fumble": then raise; "stall": pause STALL_S halfway, a window to cancel
it). A session whose ``quiet_key`` is set in Redis streams nothing (the same turn without
chunks).
"""

from __future__ import annotations

import os
import time

import redis

from config import get_settings
from state.agent import PhaseContext, PhaseResult, quick
from state.storage.redis_client import get_redis
from tasks import agent as reference
from tasks.agent import evaluating

__all__ = ["evaluating", "executing", "generating", "planning", "retrieving", "understanding"]

DAWDLE_S = 3.0
SLOW_WORKFLOW = {"steps": [{"step_id": "slow", "action": "sleep", "inputs": {"seconds": 3}}]}
LINGER_S = 2.0
STRAGGLE_S = 9.0
PONDER_S = 3.0
HANG_S = 8.0
TRICKLE_CHUNKS = 12
TRICKLE_PAUSE_S = 0.15
STALL_S = 2.0
HOLD_S = 30.0


def quiet_key(session_id: str) -> str:
    """Set in Redis: the session's handlers stream nothing."""
    return f"test:quiet:{session_id}"


def vanish_key(session_id: str) -> str:
    """The Redis counter of runs of a session's "vanish" handler."""
    return f"test:vanish:{session_id}"


def release_key(session_id: str) -> str:
    """Set in Redis: a session's "hold" handler returns."""
    return f"test:release:{session_id}"


def risky_key(session_id: str) -> str:
    """The Redis counter of runs of a session's approved "risky" action."""
    return f"test:risky:{session_id}"


def understanding(ctx: PhaseContext) -> PhaseResult:
    if "stumble" in ctx.message:
        raise RuntimeError("the understanding handler stumbled on purpose")
    return reference.understanding(ctx)


def planning(ctx: PhaseContext) -> PhaseResult:
    if "explode" in ctx.message:
        raise RuntimeError("the planner exploded on purpose")
    if "ponder" in ctx.message:
        time.sleep(PONDER_S)
    if "risky" in ctx.message:
        request = {"action": "risky", "args": {"session": ctx.session_id}}
        if "hasty" in ctx.message:
            request["ttl_s"] = 1.0
        return PhaseResult(approval=request)
    if "vanish" in ctx.message:
        # The worker process dies mid-phase, every time: a poison turn. (Planning has no
        # durable deadline that would end it anyway, as executing's would.)
        _redis().incr(vanish_key(ctx.session_id))
        os._exit(1)
    return reference.planning(ctx)


@quick  # claims to be quick, so its lock is not renewed: the limit must still hold
def retrieving(ctx: PhaseContext) -> PhaseResult:
    if "hang" in ctx.message:
        time.sleep(HANG_S)  # as good as never, for a test: the worker is stuck meanwhile
    return reference.retrieving(ctx)


def executing(ctx: PhaseContext) -> PhaseResult:
    if ctx.approval is not None and ctx.approval["action"] == "risky":
        _redis().incr(risky_key(ctx.session_id))
        if "linger" in ctx.message:
            time.sleep(LINGER_S)
        return PhaseResult("tools_complete", user_state=_count_risky_run)
    if "hold" in ctx.message:
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline and not _redis().exists(release_key(ctx.session_id)):
            time.sleep(0.02)
    elif "dawdle" in ctx.message:
        time.sleep(DAWDLE_S)
    elif "linger" in ctx.message:
        time.sleep(LINGER_S)
    elif "straggle" in ctx.message:
        time.sleep(STRAGGLE_S)
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


def _count_risky_run(state: dict[str, object]) -> dict[str, object]:
    runs = state.get("risky_runs", 0)
    return {**state, "risky_runs": (runs if isinstance(runs, int) else 0) + 1}


# Quick like the reference agent's (so inline tests run as before); a "trickle" takes two
# seconds, well within the phase time limit, and runs from its carried snapshot without
# a lock, so a FLUSHALL mid-stream costs chunks only.
@quick
def generating(ctx: PhaseContext) -> PhaseResult:
    if _redis().exists(quiet_key(ctx.session_id)):
        ctx.stream_sink = None
    if "trickle" not in ctx.message:
        return reference.generating(ctx)
    parts = [f"part {n} " for n in range(1, TRICKLE_CHUNKS + 1)]
    for n, part in enumerate(parts, start=1):
        ctx.stream(part)
        time.sleep(
            STALL_S if "stall" in ctx.message and n == TRICKLE_CHUNKS // 2 else TRICKLE_PAUSE_S
        )
        if "fumble" in ctx.message and n == TRICKLE_CHUNKS:
            raise RuntimeError("the generator fumbled after streaming, on purpose")
    return PhaseResult("response_sent", reply="".join(parts))


def _redis() -> redis.Redis:
    # The worker's own client: a Sentinel URL works, and a partition times out (5 s)
    # instead of hanging the phase.
    return get_redis(get_settings().redis_url)
