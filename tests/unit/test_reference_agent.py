"""The reference agent's phase handlers, called directly (no engine, no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from state.agent import DEFAULT_TRIGGERS, PhaseContext, PhaseResult, is_quick, load_agent
from state.errors import AgentStateError
from state.machine import WORK_PHASES, destination
from state.workflows.spec import parse_spec
from tasks import agent


def make_ctx(
    phase: str = "understanding", message: str = "hello", **overrides: Any
) -> PhaseContext:
    fields: dict[str, Any] = {
        "session_id": "s-1",
        "user_id": "u-1",
        "phase": phase,
        "message": message,
        "message_id": "m-1",
        "context": {},
        "tool_results": [],
        "pending_actions": [],
        "metadata": {},
    }
    fields.update(overrides)
    return PhaseContext(**fields)


def run_turn(message: str, **overrides: Any) -> dict[str, PhaseResult]:
    """Run understanding..generating, carrying context, plan and results forward."""
    results: dict[str, PhaseResult] = {}
    context: dict[str, Any] = {}
    pending: list[Any] = []
    tool_results: list[Any] = []
    for phase in WORK_PHASES:
        handler = getattr(agent, phase)
        ctx = make_ctx(
            phase,
            message,
            context=dict(context),
            pending_actions=pending,
            tool_results=tool_results,
            **overrides,
        )
        result = handler(ctx)
        results[phase] = result
        assert result.trigger is not None
        assert destination(phase, result.trigger) is not None
        context.update(result.context)
        if result.pending_actions is not None:
            pending = result.pending_actions
        if result.tool_results is not None:
            tool_results = result.tool_results
    return results


# --- classify -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("what is 12*7?", {"kind": "calculate", "expressions": ["12*7"]}),
        ("what is 2+3 and 4*5?", {"kind": "calculate", "expressions": ["2+3", "4*5"]}),
        ("What is (2+3)*4?", {"kind": "calculate", "expressions": ["(2+3)*4"]}),
        ("compute 1.5 * 2", {"kind": "calculate", "expressions": ["1.5 * 2"]}),
        ("what is 2^10", {"kind": "calculate", "expressions": ["2^10"]}),
        ("remember that my cat is Tom", {"kind": "remember", "fact": "my cat is Tom"}),
        ("Remember that my cat is Tom.", {"kind": "remember", "fact": "my cat is Tom"}),
        ("please remember I like tea!", {"kind": "remember", "fact": "I like tea"}),
        ("remember that 2+2 is 4", {"kind": "remember", "fact": "2+2 is 4"}),
        ("What do you remember?", {"kind": "recall"}),
        ("what did you remember about me", {"kind": "recall"}),
        ("forget everything", {"kind": "forget"}),
        ("Please FORGET ALL of it", {"kind": "forget"}),
        ("remember that I forget everything", {"kind": "remember", "fact": "I forget everything"}),
        ("don't forget everyone", {"kind": "chat"}),
        ("hello", {"kind": "chat"}),
        ("I have 3 cats", {"kind": "chat"}),
        ("", {"kind": "chat"}),
    ],
)
def test_classify(text: str, expected: dict[str, Any]) -> None:
    assert agent.classify(text) == expected


# --- understanding --------------------------------------------------------------------


@pytest.mark.parametrize("message", ["???", "", "!!", "   ", "?! ...", "\n"])
def test_understanding_without_letters_or_digits_asks_for_clarification(message: str) -> None:
    result = agent.understanding(make_ctx("understanding", message))
    assert result.trigger == "need_clarification"
    assert destination("understanding", result.trigger) == "clarifying"
    assert result.reply
    assert "?" in result.reply


@pytest.mark.parametrize(
    ("message", "kind"),
    [("hello", "chat"), ("what is 12*7?", "calculate"), ("7", "chat"), ("é", "chat")],
)
def test_understanding_of_text_is_intent_clear(message: str, kind: str) -> None:
    result = agent.understanding(make_ctx("understanding", message))
    assert result.trigger == "intent_clear"
    assert result.reply is None
    assert result.context["intent"]["kind"] == kind


# --- planning -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("intent", "plan"),
    [
        (
            {"kind": "calculate", "expressions": ["12*7"]},
            [{"tool": "calculate", "expression": "12*7"}],
        ),
        (
            {"kind": "calculate", "expressions": ["2+3", "4*5"]},
            [
                {"tool": "calculate", "expression": "2+3"},
                {"tool": "calculate", "expression": "4*5"},
            ],
        ),
        ({"kind": "remember", "fact": "x"}, [{"tool": "remember", "fact": "x"}]),
        ({"kind": "recall"}, []),
        ({"kind": "chat"}, []),
    ],
)
def test_planning(intent: dict[str, Any], plan: list[dict[str, Any]]) -> None:
    result = agent.planning(make_ctx("planning", context={"intent": intent}))
    assert result.trigger == "plan_ready"
    assert result.pending_actions == plan


def test_planning_without_intent_plans_nothing() -> None:
    result = agent.planning(make_ctx("planning"))
    assert result.trigger == "plan_ready"
    assert result.pending_actions == []


# --- retrieving -----------------------------------------------------------------------


def test_retrieving_for_recall_reads_memories() -> None:
    reads: list[int] = []

    def reader() -> dict[str, Any]:
        reads.append(1)
        return {"memories": ["my cat is Tom", "I like tea"], "other": 1}

    ctx = make_ctx("retrieving", context={"intent": {"kind": "recall"}}, user_state_reader=reader)
    result = agent.retrieving(ctx)
    assert result.trigger == "context_ready"
    assert result.context == {"memories": ["my cat is Tom", "I like tea"]}
    assert reads == [1]


def test_retrieving_for_recall_with_no_user_state() -> None:
    ctx = make_ctx("retrieving", context={"intent": {"kind": "recall"}})
    result = agent.retrieving(ctx)
    assert result.trigger == "context_ready"
    assert result.context == {"memories": []}


@pytest.mark.parametrize("kind", ["calculate", "remember", "chat"])
def test_retrieving_reads_nothing_unless_recalling(kind: str) -> None:
    def reader() -> dict[str, Any]:
        raise AssertionError("user state read for a turn that does not need it")

    ctx = make_ctx("retrieving", context={"intent": {"kind": kind}}, user_state_reader=reader)
    result = agent.retrieving(ctx)
    assert result.trigger == "context_ready"
    assert result.context == {}


# --- executing ------------------------------------------------------------------------


def test_executing_single_calculation_inline() -> None:
    plan = [{"tool": "calculate", "expression": "12*7"}]
    result = agent.executing(make_ctx("executing", pending_actions=plan))
    assert result.trigger == "tools_complete"
    assert result.workflow is None
    assert result.user_state is None
    assert result.tool_results == [
        {"tool": "calculate", "expression": "12*7", "ok": True, "value": "84"}
    ]


def test_executing_failed_calculation_is_a_result_not_an_exception() -> None:
    plan = [{"tool": "calculate", "expression": "1/0"}]
    result = agent.executing(make_ctx("executing", pending_actions=plan))
    assert result.trigger == "tools_complete"
    assert result.tool_results is not None
    [item] = result.tool_results
    assert item["ok"] is False
    assert "division by zero" in item["error"]
    assert not item.get("retriable")


def test_executing_several_calculations_starts_a_workflow() -> None:
    plan = [
        {"tool": "calculate", "expression": "2+3"},
        {"tool": "calculate", "expression": "4*5"},
    ]
    result = agent.executing(make_ctx("executing", pending_actions=plan))
    assert result.trigger is None
    assert result.workflow is not None
    steps = result.workflow["steps"]
    assert [s["action"] for s in steps] == ["calculate", "calculate"]
    assert [s["inputs"]["expression"] for s in steps] == ["2+3", "4*5"]
    # The spec is one the workflow engine accepts.
    wf = parse_spec(result.workflow, known_actions=["calculate"])
    assert len(wf.steps) == 2
    assert [s.step_id for s in wf.get_ready_steps()] == list(wf.steps)


def test_executing_collects_workflow_results_in_step_order() -> None:
    def step(index: int, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "step_id": f"calc-{index}",
            "status": status,
            "inputs": {"expression": f"e{index}"},
            "outputs": {},
            **extra,
        }

    workflow = {
        "steps": {
            "calc-10": step(10, "success", outputs={"value": 5.0}),
            "calc-2": step(2, "failed", error="CalculationError: division by zero"),
            "calc-1": step(1, "failed", error="TimeoutError: took too long"),
            "calc-3": step(3, "skipped"),
        }
    }
    plan = [{"tool": "calculate", "expression": "x"}] * 4
    result = agent.executing(make_ctx("executing", pending_actions=plan, workflow=workflow))
    assert result.trigger == "tools_complete"
    assert result.workflow is None
    assert result.tool_results == [
        {
            "tool": "calculate",
            "expression": "e1",
            "ok": False,
            "error": "took too long",
            "retriable": True,
        },
        {
            "tool": "calculate",
            "expression": "e2",
            "ok": False,
            "error": "division by zero",
            "retriable": False,
        },
        {
            "tool": "calculate",
            "expression": "e3",
            "ok": False,
            "error": "skipped",
            "retriable": True,
        },
        {"tool": "calculate", "expression": "e10", "ok": True, "value": "5"},
    ]


def _remember_result(fact: str) -> PhaseResult:
    plan = [{"tool": "remember", "fact": fact}]
    return agent.executing(make_ctx("executing", pending_actions=plan))


def test_executing_remember_returns_a_user_state_update() -> None:
    result = _remember_result("my cat is Tom")
    assert result.trigger == "tools_complete"
    assert result.tool_results == [{"tool": "remember", "ok": True, "fact": "my cat is Tom"}]
    update = result.user_state
    assert update is not None
    before = {"memories": ["I like tea"], "name": "Ann"}
    after = update(before)
    assert after == {"memories": ["I like tea", "my cat is Tom"], "name": "Ann"}
    assert before == {"memories": ["I like tea"], "name": "Ann"}  # not mutated
    assert update({}) == {"memories": ["my cat is Tom"]}


def test_remember_update_is_idempotent() -> None:
    update = _remember_result("my cat is Tom").user_state
    assert update is not None
    once = update({"memories": ["a"]})
    assert update(once) == once
    assert update(update(once)) == once
    assert once["memories"].count("my cat is Tom") == 1


def test_remember_moves_a_repeated_fact_to_the_end_once() -> None:
    update: Callable[[dict[str, Any]], dict[str, Any]] | None
    update = _remember_result("b").user_state
    assert update is not None
    assert update({"memories": ["a", "b", "c"]}) == {"memories": ["a", "c", "b"]}


def test_executing_nothing_completes_with_no_results() -> None:
    result = agent.executing(make_ctx("executing"))
    assert result.trigger == "tools_complete"
    assert result.tool_results == []
    assert result.user_state is None


# --- evaluating -----------------------------------------------------------------------

RETRIABLE = {"tool": "calculate", "expression": "e", "ok": False, "error": "x", "retriable": True}
FINAL = {"tool": "calculate", "expression": "e", "ok": False, "error": "x", "retriable": False}
GOOD = {"tool": "calculate", "expression": "e", "ok": True, "value": "1"}


@pytest.mark.parametrize(
    ("results", "attempt", "trigger"),
    [
        ([RETRIABLE], 1, "retry_needed"),
        ([GOOD, RETRIABLE], 2, "retry_needed"),
        ([RETRIABLE], 3, "result_good"),
        ([RETRIABLE], 4, "result_good"),
        ([FINAL], 1, "result_good"),
        ([GOOD], 1, "result_good"),
        ([], 1, "result_good"),
        ([{"tool": "calculate", "ok": False, "error": "x"}], 1, "result_good"),
    ],
)
def test_evaluating(results: list[dict[str, Any]], attempt: int, trigger: str) -> None:
    result = agent.evaluating(make_ctx("evaluating", tool_results=results, attempt=attempt))
    assert result.trigger == trigger
    assert destination("evaluating", trigger) is not None


# --- generating -----------------------------------------------------------------------


def test_generating_calculation_reply_contains_the_result() -> None:
    ctx = make_ctx(
        "generating",
        "what is 12*7?",
        context={"intent": {"kind": "calculate", "expressions": ["12*7"]}},
        tool_results=[{"tool": "calculate", "expression": "12*7", "ok": True, "value": "84"}],
    )
    result = agent.generating(ctx)
    assert result.trigger == "response_sent"
    assert result.reply is not None
    assert "84" in result.reply
    assert "12*7" in result.reply


def test_generating_reports_a_failed_calculation() -> None:
    ctx = make_ctx(
        "generating",
        context={"intent": {"kind": "calculate", "expressions": ["1/0"]}},
        tool_results=[
            {"tool": "calculate", "expression": "1/0", "ok": False, "error": "division by zero"}
        ],
    )
    reply = agent.generating(ctx).reply
    assert reply is not None
    assert "1/0" in reply
    assert "division by zero" in reply


def test_generating_recall_lists_memories() -> None:
    ctx = make_ctx(
        "generating",
        context={"intent": {"kind": "recall"}, "memories": ["my cat is Tom", "I like tea"]},
    )
    reply = agent.generating(ctx).reply
    assert reply is not None
    assert "my cat is Tom" in reply
    assert "I like tea" in reply


def test_generating_recall_with_nothing_stored() -> None:
    ctx = make_ctx("generating", context={"intent": {"kind": "recall"}, "memories": []})
    reply = agent.generating(ctx).reply
    assert reply
    assert "remember" in reply.lower()


def test_generating_remember_confirms_the_fact() -> None:
    ctx = make_ctx("generating", context={"intent": {"kind": "remember", "fact": "my cat is Tom"}})
    reply = agent.generating(ctx).reply
    assert reply is not None
    assert "my cat is Tom" in reply


def test_generating_chat_echoes_the_message() -> None:
    ctx = make_ctx("generating", "hello there", context={"intent": {"kind": "chat"}})
    result = agent.generating(ctx)
    assert result.trigger == "response_sent"
    assert result.reply is not None
    assert "hello there" in result.reply


# --- whole turns ----------------------------------------------------------------------


def test_whole_turn_for_arithmetic() -> None:
    results = run_turn("what is 12*7?")
    reply = results["generating"].reply
    assert reply is not None
    assert "84" in reply


def test_whole_turn_for_recall() -> None:
    results = run_turn(
        "what do you remember?", user_state_reader=lambda: {"memories": ["my cat is Tom"]}
    )
    reply = results["generating"].reply
    assert reply is not None
    assert "my cat is Tom" in reply


def test_whole_turn_for_remember_then_recall() -> None:
    results = run_turn("remember that my cat is Tom")
    update = results["executing"].user_state
    assert update is not None
    stored = update({})
    recall = run_turn("what do you remember?", user_state_reader=lambda: stored)
    reply = recall["generating"].reply
    assert reply is not None
    assert "my cat is Tom" in reply


# --- loading and quickness ------------------------------------------------------------


def test_load_agent_reference() -> None:
    loaded = load_agent("tasks.agent")
    assert loaded is load_agent("tasks.agent")
    for phase in WORK_PHASES:
        assert loaded.handler(phase) is getattr(agent, phase)
    result = loaded.run("understanding", make_ctx("understanding", "what is 12*7?"))
    assert isinstance(result, PhaseResult)
    assert result.trigger == "intent_clear"


@pytest.mark.parametrize("dotted", ["no.such.module", "nosuchmodule", "tasks.agent_nope"])
def test_load_agent_of_missing_module(dotted: str) -> None:
    with pytest.raises(AgentStateError, match="cannot import agent"):
        load_agent(dotted)


def test_load_agent_of_module_without_phases() -> None:
    with pytest.raises(AgentStateError, match="defines none of the phases"):
        load_agent("state.ids")


@pytest.mark.parametrize("phase", WORK_PHASES)
def test_quick_handlers(phase: str) -> None:
    expected = phase != "executing"
    assert is_quick(getattr(agent, phase)) is expected
    assert load_agent("tasks.agent").is_quick(phase) is expected


def test_missing_handler_is_quick() -> None:
    assert is_quick(None) is True
    assert is_quick(lambda ctx: ctx) is False


@pytest.mark.parametrize("phase", WORK_PHASES)
def test_default_triggers_are_allowed_from_their_phase(phase: str) -> None:
    assert destination(phase, DEFAULT_TRIGGERS[phase]) is not None


def test_phase_context_readers_default_to_empty() -> None:
    ctx = make_ctx()
    assert ctx.recent_messages() == []
    assert ctx.user_state() == {}
    history = [{"role": "user", "content": "hi"}]
    ctx = make_ctx(history_reader=lambda n: history[-n:], user_state_reader=lambda: {"a": 1})
    assert ctx.recent_messages(5) == history
    assert ctx.user_state() == {"a": 1}
