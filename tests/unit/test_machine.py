"""The agent FSM: the seed's ten states and thirteen transitions, exactly, and the human
approval rows added to the table as data (ARCHITECTURE.md, "Human approval")."""

from __future__ import annotations

import re

import pytest

import state.machine
from state.errors import InvalidTransitionError
from state.machine import (
    STATES,
    TRANSITIONS,
    TRIGGERS,
    AgentStateMachine,
    destination,
    mermaid_diagram,
)

SEED_STATES = [
    "idle",
    "understanding",
    "planning",
    "retrieving",
    "executing",
    "evaluating",
    "generating",
    "clarifying",
    "error",
    "timeout",
]

# (trigger, source, dest) exactly as in the seed; written out independently of the code.
SEED_TRANSITIONS: list[tuple[str, str | list[str], str]] = [
    ("receive_input", "idle", "understanding"),
    ("intent_clear", "understanding", "planning"),
    ("need_clarification", "understanding", "clarifying"),
    ("plan_ready", "planning", "retrieving"),
    ("context_ready", "retrieving", "executing"),
    ("tools_complete", "executing", "evaluating"),
    ("retry_needed", "evaluating", "executing"),
    ("result_good", "evaluating", "generating"),
    ("response_sent", "generating", "idle"),
    ("user_responded", "clarifying", "understanding"),
    ("error_occurred", "*", "error"),
    ("timeout", "*", "timeout"),
    ("reset", ["error", "timeout"], "idle"),
]
# Added for human approval: one state, three rows.
APPROVAL_STATES = ["awaiting_approval"]
APPROVAL_TRANSITIONS: list[tuple[str, str | list[str], str]] = [
    ("need_approval", ["planning", "executing"], "awaiting_approval"),
    ("approved", "awaiting_approval", "executing"),
    ("rejected", "awaiting_approval", "generating"),
]
ALL_STATES = SEED_STATES + APPROVAL_STATES
ALL_TRANSITIONS = SEED_TRANSITIONS + APPROVAL_TRANSITIONS
SEED_TRIGGERS = [t for t, _, _ in SEED_TRANSITIONS]
ALL_TRIGGERS = [t for t, _, _ in ALL_TRANSITIONS]


def _sources(source: str | list[str]) -> list[str]:
    if source == "*":
        return list(ALL_STATES)
    return [source] if isinstance(source, str) else list(source)


# Every allowed (state, trigger) -> dest, expanded from the seed table.
ALLOWED: dict[tuple[str, str], str] = {
    (src, trig): dest for trig, source, dest in ALL_TRANSITIONS for src in _sources(source)
}
NOT_ALLOWED = [(s, t) for s in ALL_STATES for t in ALL_TRIGGERS if (s, t) not in ALLOWED]
ALLOWED_CASES = sorted((s, t, d) for (s, t), d in ALLOWED.items())


def test_states_are_the_seed_states_in_order_then_awaiting_approval() -> None:
    assert STATES == ALL_STATES
    assert STATES[:10] == SEED_STATES
    assert AgentStateMachine.states == ALL_STATES


def test_transitions_are_the_seed_transitions_then_the_approval_rows() -> None:
    rows = [(row["trigger"], row["source"], row["dest"]) for row in TRANSITIONS]
    assert rows[:13] == SEED_TRANSITIONS
    assert rows == ALL_TRANSITIONS
    assert AgentStateMachine.transitions == TRANSITIONS
    assert len(TRANSITIONS) == 13 + 3
    assert all(set(row) == {"trigger", "source", "dest"} for row in TRANSITIONS)


def test_triggers_are_the_thirteen_seed_triggers_in_order_then_three() -> None:
    assert list(TRIGGERS)[:13] == SEED_TRIGGERS
    assert list(TRIGGERS) == ALL_TRIGGERS
    assert len(set(TRIGGERS)) == 16


def test_expanded_table_has_the_expected_size() -> None:
    # 10 single-source rows + 11 for each of the two '*' rows + 2 for reset, and the
    # approval rows: 2 sources for need_approval, 1 each for approved and rejected.
    assert len(ALLOWED) == 10 + 11 + 11 + 2 + 2 + 1 + 1
    assert len(NOT_ALLOWED) == 11 * 16 - len(ALLOWED)


@pytest.mark.parametrize("via", ["trigger", "method"])
@pytest.mark.parametrize(("source", "trigger", "dest"), ALLOWED_CASES)
def test_every_seed_transition_fires_from_each_source(
    source: str, trigger: str, dest: str, via: str
) -> None:
    m = AgentStateMachine("s-1", initial=source)
    result = m.trigger(trigger) if via == "trigger" else getattr(m, trigger)()
    assert result == dest
    assert m.state == dest
    assert m.path == [dest]


@pytest.mark.parametrize("via", ["trigger", "method"])
@pytest.mark.parametrize(("source", "trigger"), NOT_ALLOWED)
def test_every_disallowed_pair_raises_and_keeps_the_state(
    source: str, trigger: str, via: str
) -> None:
    m = AgentStateMachine("s-1", initial=source)
    with pytest.raises(InvalidTransitionError) as info:
        if via == "trigger":
            m.trigger(trigger)
        else:
            getattr(m, trigger)()
    assert m.state == source
    assert m.path == []
    message = str(info.value)
    assert trigger in message
    assert source in message


@pytest.mark.parametrize("name", ["to_idle", "nope", "", "RECEIVE_INPUT", "trigger", "state"])
def test_unknown_trigger_raises(name: str) -> None:
    m = AgentStateMachine("s-1")
    with pytest.raises(InvalidTransitionError):
        m.trigger(name)
    assert m.state == "idle"
    assert m.path == []
    assert m.may_trigger(name) is False


@pytest.mark.parametrize("initial", ["nope", "", "Idle", "*", "to_idle"])
def test_unknown_initial_state_raises(initial: str) -> None:
    with pytest.raises(InvalidTransitionError):
        AgentStateMachine("s", initial=initial)


@pytest.mark.parametrize("initial", SEED_STATES)
def test_restore_at_any_state(initial: str) -> None:
    m = AgentStateMachine("s-7", initial=initial)
    assert m.state == initial
    assert m.session_id == "s-7"
    assert m.path == []


def test_default_initial_state_is_idle() -> None:
    assert AgentStateMachine("s").state == "idle"


@pytest.mark.parametrize("state_name", SEED_STATES)
@pytest.mark.parametrize("trigger", SEED_TRIGGERS)
def test_destination_matches_the_seed_table(state_name: str, trigger: str) -> None:
    assert destination(state_name, trigger) == ALLOWED.get((state_name, trigger))


@pytest.mark.parametrize("state_name", SEED_STATES)
@pytest.mark.parametrize("trigger", SEED_TRIGGERS)
def test_may_trigger_agrees_with_destination(state_name: str, trigger: str) -> None:
    m = AgentStateMachine("s", initial=state_name)
    assert m.may_trigger(trigger) is (destination(state_name, trigger) is not None)
    assert m.state == state_name  # asking changes nothing


def test_destination_of_unknown_trigger_is_none() -> None:
    assert destination("idle", "nope") is None


def test_path_records_every_state_entered() -> None:
    m = AgentStateMachine("s")
    m.receive_input()
    m.intent_clear()
    m.plan_ready()
    m.context_ready()
    m.tools_complete()
    m.retry_needed()
    m.tools_complete()
    m.result_good()
    with pytest.raises(InvalidTransitionError):
        m.reset()  # refused: not recorded
    m.response_sent()
    assert m.path == [
        "understanding",
        "planning",
        "retrieving",
        "executing",
        "evaluating",
        "executing",
        "evaluating",
        "generating",
        "idle",
    ]
    assert m.state == "idle"


def test_clarification_round_trip_and_error_recovery() -> None:
    m = AgentStateMachine("s")
    assert m.receive_input() == "understanding"
    assert m.need_clarification() == "clarifying"
    assert m.user_responded() == "understanding"
    assert m.error_occurred() == "error"
    assert m.error_occurred() == "error"  # '*' includes error itself
    assert m.reset() == "idle"
    assert m.timeout() == "timeout"
    assert m.reset() == "idle"
    assert m.path == [
        "understanding",
        "clarifying",
        "understanding",
        "error",
        "error",
        "idle",
        "timeout",
        "idle",
    ]


def test_machines_are_independent() -> None:
    a = AgentStateMachine("a")
    b = AgentStateMachine("b", initial="executing")
    a.receive_input()
    assert a.state == "understanding"
    assert b.state == "executing"
    b.tools_complete()
    assert a.state == "understanding"
    assert b.state == "evaluating"
    assert a.path == ["understanding"]
    assert b.path == ["evaluating"]


_EDGE = re.compile(r"^\s+(\w+) --> (\w+): (\w+)$")


def _expected_edges() -> set[tuple[str, str, str]]:
    return {(src, dest, trig) for (src, trig), dest in ALLOWED.items() if src != dest}


def test_mermaid_diagram_has_one_line_per_edge() -> None:
    text = mermaid_diagram()
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    edges = [m.groups() for m in map(_EDGE.match, lines) if m]
    assert len(edges) == len(set(edges)), "an edge is drawn twice"
    assert set(edges) == _expected_edges()
    # Self loops from '*' are left out.
    assert ("error", "error", "error_occurred") not in edges
    assert ("timeout", "timeout", "timeout") not in edges
    # Every other line is the initial-state marker.
    others = [line for line in lines[1:] if not _EDGE.match(line)]
    assert [line.strip() for line in others] == ["[*] --> idle"]


def test_many_restored_machines_are_not_registered_on_the_shared_machine() -> None:
    shared = state.machine._shared_machine()
    assert shared is state.machine._shared_machine()
    before = list(shared.models)
    machines = [AgentStateMachine(f"s-{i}", initial=STATES[i % len(STATES)]) for i in range(1000)]
    for m in machines:
        m.trigger("error_occurred")
    assert all(m.state == "error" for m in machines)
    assert len(shared.models) == len(before)
    assert shared.models == []
    ids = {id(m) for m in machines}
    assert not any(id(model) in ids for model in shared.models)
