"""Typos in an agent are caught where they are made, with a suggestion: a trigger name
when the PhaseResult is built, a handler name when the agent is loaded (a worker loads it
at start), and every key of the turn's context that the engine writes is reserved."""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from state.agent import ENGINE_CONTEXT_KEYS, Agent, PhaseContext, PhaseResult, load_agent
from state.errors import AgentDefinitionError, InvalidTransitionError, UnknownTriggerError
from state.machine import Trigger
from state.turns import rules

TURNS = Path(rules.__file__).parent


def handler(ctx: PhaseContext) -> PhaseResult:
    return PhaseResult("response_sent", reply="hi")


def test_an_unknown_trigger_raises_where_the_result_is_built_naming_the_nearest() -> None:
    with pytest.raises(UnknownTriggerError) as caught:
        PhaseResult("intent_clr")
    assert "unknown trigger 'intent_clr' (did you mean 'intent_clear'?)" in str(caught.value)
    assert isinstance(caught.value, InvalidTransitionError)  # what a bad trigger always was
    with pytest.raises(UnknownTriggerError, match="did you mean 'response_sent'"):
        PhaseResult(trigger="respons_sent", reply="x")
    with pytest.raises(UnknownTriggerError, match="not int"):
        PhaseResult(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("trigger", [None, "intent_clear", Trigger.RESULT_GOOD, "timeout"])
def test_every_trigger_of_the_table_and_none_still_build(trigger: str | None) -> None:
    # Whether the trigger is allowed from the phase is still the FSM's to say, at commit.
    assert PhaseResult(trigger).trigger == trigger


def test_a_handler_name_near_a_missing_phase_is_refused_with_the_phase_it_meant() -> None:
    with pytest.raises(AgentDefinitionError) as caught:
        Agent(SimpleNamespace(understanding=handler, generatng=handler), "typo")
    message = str(caught.value)
    assert "'generatng' is not a phase (did you mean 'generating'?)" in message
    assert "start a helper's name with _" in message


def test_a_module_with_only_a_misspelled_handler_names_the_phases_plainly() -> None:
    with pytest.raises(AgentDefinitionError) as caught:
        Agent(SimpleNamespace(generatng=handler), "only-typo")
    message = str(caught.value)
    assert "defines none of the phases understanding, planning, retrieving" in message
    assert "did you mean 'generating'?" in message
    assert "Phase." not in message and "<" not in message  # names, not enum reprs


def test_helpers_far_from_a_phase_or_next_to_the_phase_itself_are_fine() -> None:
    source = SimpleNamespace(
        generating=handler, generate=handler, plan=handler, _understandng=handler
    )
    assert Agent(source, "helpers").handler("generating") is handler


@pytest.fixture
def typo_module() -> Iterator[str]:
    module = types.ModuleType("typo_agent_for_tests")
    module.understanding = handler  # type: ignore[attr-defined]
    exec("def generatng(ctx):\n    return None\n", module.__dict__)  # defined in the module
    module.generatng.__module__ = module.__name__
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


def test_loading_a_module_with_a_misspelled_handler_fails(typo_module: str) -> None:
    with pytest.raises(AgentDefinitionError, match="did you mean 'generating'"):
        load_agent(typo_module)


def test_functions_a_module_imports_are_not_taken_for_its_handlers() -> None:
    module = types.ModuleType("imports_agent_for_tests")
    module.generating = handler  # type: ignore[attr-defined]
    module.understandng = handler  # type: ignore[attr-defined]  # defined in this test module
    assert Agent(module, "imports").handler("generating") is handler


def _keys_written_to_the_context(tree: ast.Module, constants: dict[str, str]) -> set[str]:
    def key(node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    def is_context(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "context"

    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Subscript) and is_context(target.value):
                found.add(str(key(target.slice)))
            elif is_context(target) and isinstance(node.value, ast.Dict):
                found.update(str(key(k)) for k in node.value.keys)
    return found


def test_every_key_the_engine_writes_into_the_turns_context_is_reserved() -> None:
    written: set[str] = set()
    for path in sorted(TURNS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value.value, str)
        }
        written |= _keys_written_to_the_context(tree, constants)
    assert {"message", "message_id", "attempt", "workflow_id", "approval_id", "approval"} <= (
        written
    )
    assert written <= ENGINE_CONTEXT_KEYS, written - ENGINE_CONTEXT_KEYS
