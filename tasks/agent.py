"""The reference agent: deterministic phase handlers, no LLM needed.

- arithmetic ("what is 12*7?") is planned as calculator calls; two or more run as a
  workflow, one runs inline in ``executing``;
- "remember that X" stores X in the user's persistent state, "what do you remember"
  lists it, across sessions;
- a message with no letter or digit goes to ``clarifying``;
- anything else gets a plain reply.

A real agent replaces this module through ``AGENTSTATE_AGENT`` (see ``state.agent``).
"""

from __future__ import annotations

import re
from typing import Any

from state.agent import PhaseContext, PhaseResult, quick
from state.calculator import evaluate, format_number
from state.documents.codec import Document
from state.errors import CalculationError

MAX_ATTEMPTS = 3

_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?remember\s+(?:that\s+)?(?P<fact>.+?)[\s.!]*$", re.I | re.S
)
_RECALL = re.compile(
    r"\bwhat\s+(?:do|did)\s+you\s+remember\b|\bwhat\s+have\s+you\s+remembered\b", re.I
)
_NUMBER = r"\d+(?:\.\d+)?"
_EXPRESSION = re.compile(
    rf"[(\s]*-?{_NUMBER}[)\s]*(?:(?:\*\*|[-+*/%^\u00d7\u00f7])[(\s]*-?{_NUMBER}[)\s]*)+"
)


def classify(text: str) -> Document:
    """The intent of a message."""
    remember = _REMEMBER.match(text)
    if remember:
        return {"kind": "remember", "fact": remember.group("fact").strip()}
    if _RECALL.search(text):
        return {"kind": "recall"}
    expressions = [_balanced(m.group(0)) for m in _EXPRESSION.finditer(text)]
    expressions = [e for e in expressions if e]
    if expressions:
        return {"kind": "calculate", "expressions": expressions}
    return {"kind": "chat"}


def _balanced(expression: str) -> str:
    # The pattern may take a stray parenthesis from the surrounding prose; drop extras.
    expression = expression.strip()
    while expression.count("(") > expression.count(")") and expression.startswith("("):
        expression = expression[1:].strip()
    while expression.count(")") > expression.count("(") and expression.endswith(")"):
        expression = expression[:-1].strip()
    return expression


@quick
def understanding(ctx: PhaseContext) -> PhaseResult:
    """Clarify if there is nothing to understand, else classify the message."""
    if not any(ch.isalnum() for ch in ctx.message):
        return PhaseResult(
            "need_clarification",
            reply="I didn't catch that. Could you tell me, in words or numbers, what you need?",
        )
    return PhaseResult("intent_clear", context={"intent": classify(ctx.message)})


@quick
def planning(ctx: PhaseContext) -> PhaseResult:
    """Turn the intent into tool calls."""
    intent = ctx.context.get("intent", {"kind": "chat"})
    plan: list[Document] = []
    if intent["kind"] == "calculate":
        plan = [{"tool": "calculate", "expression": e} for e in intent["expressions"]]
    elif intent["kind"] == "remember":
        plan = [{"tool": "remember", "fact": intent["fact"]}]
    return PhaseResult("plan_ready", pending_actions=plan)


@quick
def retrieving(ctx: PhaseContext) -> PhaseResult:
    """Fetch what the user asked us to remember, when the turn needs it."""
    intent = ctx.context.get("intent", {})
    if intent.get("kind") != "recall":
        return PhaseResult("context_ready")
    memories = ctx.user_state().get("memories", [])
    return PhaseResult("context_ready", context={"memories": list(memories)})


def executing(ctx: PhaseContext) -> PhaseResult:
    """Run the plan: one calculation inline, several as a workflow; store memories."""
    plan = ctx.pending_actions
    calculations = [p for p in plan if p["tool"] == "calculate"]
    if ctx.workflow is not None:
        return PhaseResult("tools_complete", tool_results=_workflow_results(ctx.workflow))
    if len(calculations) > 1:
        return PhaseResult(
            None, workflow=_calculation_workflow(calculations), active_tools=["calculate"]
        )
    results = [_calculate(p["expression"]) for p in calculations]
    facts = [p["fact"] for p in plan if p["tool"] == "remember"]
    if not facts:
        return PhaseResult("tools_complete", tool_results=results, active_tools=[])
    results += [{"tool": "remember", "ok": True, "fact": fact} for fact in facts]
    return PhaseResult(
        "tools_complete", tool_results=results, active_tools=[], user_state=_remembering(facts)
    )


@quick
def evaluating(ctx: PhaseContext) -> PhaseResult:
    """Retry the tools when a retriable call failed and attempts remain."""
    failed = [r for r in ctx.tool_results if not r.get("ok") and r.get("retriable")]
    if failed and ctx.attempt < MAX_ATTEMPTS:
        return PhaseResult("retry_needed", context={"workflow_id": None})
    return PhaseResult("result_good")


@quick
def generating(ctx: PhaseContext) -> PhaseResult:
    """Write the reply."""
    intent = ctx.context.get("intent", {"kind": "chat"})
    return PhaseResult("response_sent", reply=_reply(intent, ctx))


def _reply(intent: Document, ctx: PhaseContext) -> str:
    kind = intent["kind"]
    if kind == "calculate":
        return " and ".join(_describe(r) for r in ctx.tool_results) or "I found nothing to compute."
    if kind == "remember":
        return f"Got it. I'll remember that {intent['fact']}."
    if kind == "recall":
        memories = ctx.context.get("memories") or []
        if not memories:
            return "I don't remember anything for you yet. Tell me with 'remember that ...'."
        return "Here is what I remember: " + "; ".join(memories) + "."
    return (
        f"You said: \u201c{ctx.message.strip()[:200]}\u201d. I can do arithmetic "
        "(\u201cwhat is 12*7?\u201d) and remember things (\u201cremember that ...\u201d)."
    )


def _describe(result: Document) -> str:
    if result.get("ok"):
        return f"{result['expression']} = {result['value']}"
    return f"I couldn't compute {result['expression']} ({result['error']})"


def _calculate(expression: str) -> Document:
    try:
        value = format_number(evaluate(expression))
    except CalculationError as exc:
        return {"tool": "calculate", "expression": expression, "ok": False, "error": str(exc)}
    return {"tool": "calculate", "expression": expression, "ok": True, "value": value}


def _calculation_workflow(calculations: list[Document]) -> Document:
    steps = [
        {
            "step_id": f"calc-{index}",
            "action": "calculate",
            "inputs": {"expression": call["expression"]},
            "max_retries": 1,
        }
        for index, call in enumerate(calculations)
    ]
    return {"steps": steps, "context": {"purpose": "agent tool calls"}}


def _workflow_results(workflow: Document) -> list[Document]:
    results = []
    for step in sorted(workflow["steps"].values(), key=lambda s: int(s["step_id"].split("-")[1])):
        expression = step["inputs"].get("expression", "")
        if step["status"] == "success":
            value = format_number(step["outputs"]["value"])
            results.append(
                {"tool": "calculate", "expression": expression, "ok": True, "value": value}
            )
        else:
            error = step.get("error") or step["status"]
            deterministic = "CalculationError" in error
            results.append(
                {
                    "tool": "calculate",
                    "expression": expression,
                    "ok": False,
                    "error": error.split(": ", 1)[-1],
                    "retriable": not deterministic,
                }
            )
    return results


def _remembering(facts: list[str]) -> Any:
    def remember(state: Document) -> Document:
        memories = [m for m in state.get("memories", []) if m not in facts]
        return {**state, "memories": [*memories, *facts]}

    return remember
