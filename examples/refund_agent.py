"""An agent that asks a person before it acts: "refund order 42" waits for an approval,
and the refund is made once someone approves (docs/guides/approvals.md).

Run workers with it (this folder on the path):

    PYTHONPATH=examples AGENTSTATE_AGENT=refund_agent celery -A tasks worker

tests/e2e/test_examples.py runs it through a real worker, approved and rejected.
"""

from __future__ import annotations

import re
from typing import Any

from state.agent import PhaseContext, PhaseResult, quick

ORDER = re.compile(r"\brefund order (\d+)\b", re.IGNORECASE)


@quick
def planning(ctx: PhaseContext) -> PhaseResult:
    found = ORDER.search(ctx.message)
    if found is None:
        return PhaseResult("plan_ready")
    # 1. Ask, with everything the action needs in args. Approved, the turn goes on at
    #    executing: retrieving does not run in this turn, so nothing may depend on it.
    return PhaseResult(approval={"action": "refund", "args": {"order": int(found.group(1))}})


def executing(ctx: PhaseContext) -> PhaseResult:
    # 2. Act here: executing is the phase right after a "yes", the only one that sees
    #    ctx.approval (a "no" skips it). The approval id is the refund's idempotency key.
    if ctx.approval is None or not ctx.approval["approved"]:
        return PhaseResult("tools_complete")
    approval_id, order = ctx.approval["approval_id"], ctx.approval["args"]["order"]

    def record(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "refunds": {**state.get("refunds", {}), approval_id: order}}

    # 3. Pass on what later phases need: by generating, ctx.approval is gone.
    return PhaseResult("tools_complete", context={"refunded": order}, user_state=record)


@quick
def generating(ctx: PhaseContext) -> PhaseResult:
    if "refunded" in ctx.context:
        return PhaseResult("response_sent", reply=f"Refunded order {ctx.context['refunded']}.")
    if ctx.approval is not None:  # rejected: the turn came straight here, with the decision
        order, by = ctx.approval["args"]["order"], ctx.approval["by"]
        return PhaseResult("response_sent", reply=f"I did not refund order {order} ({by} said no).")
    return PhaseResult("response_sent", reply="Ask me to refund an order: 'refund order 42'.")
