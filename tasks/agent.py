"""The reference agent: deterministic phase handlers, no LLM needed.

- arithmetic ("what is 12*7?") is planned as calculator calls; two or more run as a
  workflow, one runs inline in ``executing``;
- "remember that X" stores X in the user's persistent state, "what do you remember"
  lists it, across sessions; "forget everything" asks a person for approval
  (``forget_memories``), clears the memories once approved, and keeps them if rejected
  or if nobody decides in time;
- a message with no letter or digit goes to ``clarifying``;
- anything else gets a plain reply.

What one message may cost is bounded (Settings, read through ``config.get_settings()``),
because a message is anyone's text:

- reading it is linear in its length (``tasks.intent``);
- a message with more than ``max_calculations_per_message`` expressions computes none of
  them: the reply says so and asks for smaller groups (computing only the first N would
  answer a question the user did not ask);
- a fact longer than ``max_fact_bytes`` (UTF-8) is not stored, and the reply says why;
- memory keeps the user's latest ``max_facts`` facts: remembering one more forgets the
  oldest. Dropping happens inside the guarded user-state update, so two sessions
  remembering at once cannot exceed the bound (a refusal would need a read outside it);
- a reply longer than ``max_reply_bytes`` (UTF-8) is cut, ending in an ellipsis.

A real agent replaces this module through ``AGENTSTATE_AGENT`` (see ``state.agent``).
"""

from __future__ import annotations

from typing import Any

from config import get_settings
from state.agent import PhaseContext, PhaseResult, quick
from state.calculator import evaluate, format_number
from state.documents.codec import Document
from state.errors import CalculationError
from tasks.intent import classify as read_intent

MAX_ATTEMPTS = 3
ELLIPSIS = "\u2026"
FORGET_ACTION = "forget_memories"
STREAM_PARTS = 3  # chunks a reply is streamed in


def classify(text: str) -> Document:
    """The intent of a message (see ``tasks.intent``), under this deployment's limits."""
    return read_intent(text, get_settings().max_calculations_per_message)


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
    limit = get_settings().max_calculations_per_message
    if intent["kind"] == "calculate" and len(intent["expressions"]) > limit:
        # Never planned beyond the limit, whoever wrote the intent.
        refused = {"kind": "too_many_calculations", "limit": limit}
        return PhaseResult("plan_ready", pending_actions=plan, context={"intent": refused})
    if intent["kind"] == "calculate":
        plan = [{"tool": "calculate", "expression": e} for e in intent["expressions"]]
    elif intent["kind"] == "remember":
        plan = [{"tool": "remember", "fact": intent["fact"]}]
    elif intent["kind"] == "forget":
        # Forgetting cannot be undone: a person says yes first.
        count = len(_memories(ctx.user_state()))
        return PhaseResult(approval={"action": FORGET_ACTION, "args": {"memories": count}})
    return PhaseResult("plan_ready", pending_actions=plan)


@quick
def retrieving(ctx: PhaseContext) -> PhaseResult:
    """Fetch what the user asked us to remember, when the turn needs it."""
    intent = ctx.context.get("intent", {})
    if intent.get("kind") != "recall":
        return PhaseResult("context_ready")
    memories = _memories(ctx.user_state())[-get_settings().max_facts :]
    return PhaseResult("context_ready", context={"memories": memories})


def executing(ctx: PhaseContext) -> PhaseResult:
    """Run the plan: one calculation inline, several as a workflow; store memories."""
    if ctx.approval is not None and ctx.approval["action"] == FORGET_ACTION:
        # Approved (a rejection goes straight to generating): runs once, in this phase.
        forgotten = {"tool": "forget", "ok": True, "by": ctx.approval["by"]}
        return PhaseResult("tools_complete", tool_results=[forgotten], user_state=_forgetting)
    plan = ctx.pending_actions
    calculations = [p for p in plan if p["tool"] == "calculate"]
    if ctx.workflow is not None:
        return PhaseResult("tools_complete", tool_results=_workflow_results(ctx.workflow))
    if len(calculations) > 1:
        return PhaseResult(
            None, workflow=_calculation_workflow(calculations), active_tools=["calculate"]
        )
    results = [_calculate(p["expression"]) for p in calculations]
    remembered = [_remember(p["fact"]) for p in plan if p["tool"] == "remember"]
    facts = [r["fact"] for r in remembered if r["ok"]]
    results += remembered
    if not facts:
        return PhaseResult("tools_complete", tool_results=results, active_tools=[])
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
    reply = truncated(_reply(intent, ctx), get_settings().max_reply_bytes)
    for chunk in chunks(reply):
        ctx.stream(chunk)  # followers see it come (a model would send words as it writes)
    return PhaseResult("response_sent", reply=reply)


def chunks(text: str, parts: int = STREAM_PARTS) -> list[str]:
    """``text`` cut at spaces into at most ``parts`` pieces that join back to it."""
    words = text.split(" ")
    size = -(-len(words) // parts)
    return [
        " ".join(words[start : start + size]) + (" " if start + size < len(words) else "")
        for start in range(0, len(words), size)
    ]


def truncated(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, ending in an ellipsis if cut."""
    if len(text) * 4 <= max_bytes or len(text.encode("utf-8")) <= max_bytes:
        return text
    room = max_bytes - len(ELLIPSIS.encode("utf-8"))
    # Cutting the bytes may split a character; "ignore" drops its stray first bytes.
    return text.encode("utf-8")[:room].decode("utf-8", "ignore") + ELLIPSIS


def _reply(intent: Document, ctx: PhaseContext) -> str:
    kind = intent["kind"]
    if kind in ("calculate", "too_many_calculations"):
        return _calculation_reply(intent, ctx.tool_results)
    if kind in ("remember", "recall"):
        return _memory_reply(intent, ctx)
    if kind == "forget":
        return _forget_reply(ctx)
    return (
        f"You said: \u201c{ctx.message.strip()[:200]}\u201d. I can do arithmetic "
        "(\u201cwhat is 12*7?\u201d) and remember things (\u201cremember that ...\u201d)."
    )


def _calculation_reply(intent: Document, results: list[Document]) -> str:
    if intent["kind"] == "too_many_calculations":
        return (
            f"I compute at most {intent['limit']} expressions per message, and yours has "
            "more, so I computed none of them. Could you send them in smaller groups?"
        )
    return " and ".join(_describe(r) for r in results) or "I found nothing to compute."


def _memory_reply(intent: Document, ctx: PhaseContext) -> str:
    if intent["kind"] == "remember":
        refused = [r for r in ctx.tool_results if r.get("tool") == "remember" and not r["ok"]]
        if refused:
            return f"Sorry, I can't remember that: {refused[0]['error']}."
        return f"Got it. I'll remember that {intent['fact']}."
    memories = ctx.context.get("memories") or []
    if not memories:
        return "I don't remember anything for you yet. Tell me with 'remember that ...'."
    return "Here is what I remember: " + "; ".join(memories) + "."


def _forget_reply(ctx: PhaseContext) -> str:
    if any(r.get("tool") == "forget" and r.get("ok") for r in ctx.tool_results):
        return "Done: I have forgotten everything I remembered for you."
    decision = ctx.approval or {}
    if decision.get("by") == "expired":
        return "Nobody approved forgetting in time, so I kept your memories."
    return "Forgetting was not approved, so I kept your memories."


def _forgetting(state: Document) -> Document:
    return {**state, "memories": []}


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


def _remember(fact: str) -> Document:
    limit = get_settings().max_fact_bytes
    size = len(fact.encode("utf-8"))
    if size > limit:
        error = f"it is {size} bytes long, and I keep facts of at most {limit} bytes"
        return {"tool": "remember", "ok": False, "error": error}
    return {"tool": "remember", "ok": True, "fact": fact}


def _memories(state: Document) -> list[str]:
    # User state is anyone's JSON (save_user_state): read only a list of strings from it.
    memories = state.get("memories")
    if not isinstance(memories, list):
        return []
    return [m for m in memories if isinstance(m, str)]


def _remembering(facts: list[str]) -> Any:
    keep = get_settings().max_facts

    def remember(state: Document) -> Document:
        memories = [m for m in _memories(state) if m not in facts]
        return {**state, "memories": [*memories, *facts][-keep:]}

    return remember
