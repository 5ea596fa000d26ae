"""The keys of a turn's context that the engine owns: a handler that changes one gets its
turn ended with an apology naming the key (nothing of that phase kept); one that passes
the context on unchanged (``{**ctx.context, ...}``) goes on as before."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from config import Settings
from state.agent import ENGINE_CONTEXT_KEYS, Agent, PhaseContext, PhaseResult
from tests.integration.test_turn_endings import engine_with, start


def _planning_setting(context: dict[str, Any]) -> Agent:
    def planning(ctx: PhaseContext) -> PhaseResult:
        return PhaseResult("plan_ready", context=context, metadata={"planned": True})

    return Agent(SimpleNamespace(planning=planning), "sets-context")


@pytest.mark.parametrize(
    "key", ["attempt", "message", "message_id", "workflow_id", "approval_id", "approval"]
)
def test_a_result_changing_an_engine_key_ends_the_turn_naming_it(
    settings: Settings, key: str
) -> None:
    assert key in ENGINE_CONTEXT_KEYS
    engine, dispatcher = engine_with(settings, _planning_setting({key: 7, "mine": 1}))
    session_id = start(engine, dispatcher, "hello")
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    error = doc["metadata"]["last_error"]
    assert error["phase"] == "planning"
    assert f"ReservedContextKeyError: the result's context sets {key!r}" in error["detail"]
    assert "planned" not in doc["metadata"]  # nothing of the phase was kept
    assert "mine" not in doc["context_window"]


def test_a_handler_passing_the_context_on_unchanged_goes_on(settings: Settings) -> None:
    seen: list[dict[str, Any]] = []

    def planning(ctx: PhaseContext) -> PhaseResult:
        return PhaseResult("plan_ready", context={**ctx.context, "mine": 1})

    def generating(ctx: PhaseContext) -> PhaseResult:
        seen.append(ctx.context)
        return PhaseResult("response_sent", reply=f"{ctx.message} {ctx.context['mine']}")

    agent = Agent(SimpleNamespace(planning=planning, generating=generating), "passes-on")
    engine, dispatcher = engine_with(settings, agent)
    session_id = start(engine, dispatcher, "hello")
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and "last_error" not in doc["metadata"]
    assert doc["message_history"][-1]["content"] == "hello 1"
    assert seen[0]["attempt"] == 1 and seen[0]["message"] == "hello"
