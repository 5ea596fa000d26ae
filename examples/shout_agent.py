"""A complete small agent: it shouts your message back and counts your shouts.

Run workers with it (this folder on the path; docs/guides/agents.md):

    PYTHONPATH=examples AGENTSTATE_AGENT=shout_agent celery -A tasks worker

It defines three of the six phases; planning, executing and evaluating fire their
default triggers. tests/e2e/test_examples.py runs it through a real worker.
"""

from __future__ import annotations

from state.agent import PhaseContext, PhaseResult, quick


@quick
def understanding(ctx: PhaseContext) -> PhaseResult:
    # Nothing to shout: ask, and the session rests in "clarifying" until the user answers.
    if not any(char.isalnum() for char in ctx.message):
        return PhaseResult("need_clarification", reply="Say something and I will shout it.")
    return PhaseResult("intent_clear", context={"loud": ctx.message.upper()})


def retrieving(ctx: PhaseContext) -> PhaseResult:
    # Not @quick: it reads the database (the user's state, kept across sessions).
    shouts = ctx.user_state().get("shouts", 0)
    return PhaseResult("context_ready", context={"shouts": shouts})


@quick
def generating(ctx: PhaseContext) -> PhaseResult:
    number = ctx.context["shouts"] + 1
    return PhaseResult(
        "response_sent",
        reply=f"{ctx.context['loud']}! (shout {number})",
        metadata={"last_shout": number},
        # Runs inside the commit, on the locked row: concurrent sessions lose no count.
        user_state=lambda state: {**state, "shouts": state.get("shouts", 0) + 1},
    )
