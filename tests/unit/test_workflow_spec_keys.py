"""Workflow spec keys: a typo is refused with the nearest valid key; the planned keys of
run control and approvals are accepted and type-checked."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from state.errors import UnknownActionError, WorkflowSpecError
from state.workflows.spec import SPEC_KEYS, STEP_KEYS, parse_spec


def step(step_id: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "action": "echo", "dependencies": list(deps), **extra}


def test_depends_on_is_refused_and_dependencies_suggested() -> None:
    raw = {"steps": [step("a"), {"step_id": "b", "action": "echo", "depends_on": ["a"]}]}
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec(raw)
    message = str(info.value)
    assert "step 'b'" in message
    assert "unknown key 'depends_on' (did you mean 'dependencies'?)" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("dependency", "dependencies"),
        ("input", "inputs"),
        ("max_retry", "max_retries"),
        ("retries", "max_retries"),
        ("timeout", "timeout_s"),
        ("actoin", "action"),
        ("name", "step_name"),
    ],
)
def test_a_step_key_typo_names_the_nearest_key(typo: str, meant: str) -> None:
    with pytest.raises(WorkflowSpecError, match=rf"'{typo}' \(did you mean '{meant}'\?\)"):
        parse_spec({"steps": [step("a", **{typo: 1})]})


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("step", "steps"), ("workflowid", "workflow_id"), ("ctx", "context"), ("session", None)],
)
def test_a_top_level_key_typo_is_refused(typo: str, meant: str | None) -> None:
    raw = {"steps": [step("a")], typo: "x"}
    with pytest.raises(WorkflowSpecError, match=rf"workflow spec: unknown key '{typo}'") as info:
        parse_spec(raw)
    if meant:
        assert f"did you mean '{meant}'?" in str(info.value)
    assert "valid keys: workflow_id, session_id, context, steps" in str(info.value)


def test_a_key_with_no_near_match_lists_the_valid_keys() -> None:
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec({"steps": [step("a", after=["x"])]})
    message = str(info.value)
    assert "unknown key 'after';" in message and "did you mean" not in message
    assert "valid keys: " + ", ".join(STEP_KEYS) in message


def test_many_unknown_keys_make_one_short_line() -> None:
    junk = {f"junk{i}-{'x' * 500}": i for i in range(50)}
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec({"steps": [step("a", **junk)]})
    message = str(info.value)
    assert "unknown keys" in message and "and 45 more" in message
    assert len(message) < 1000 and "\n" not in message


def test_every_public_key_is_accepted() -> None:
    raw = {
        "workflow_id": "wf-keys",
        "session_id": "s-keys",
        "context": {"k": 1},
        "steps": [
            {
                "step_id": "a",
                "step_name": "first",
                "action": "echo",
                "inputs": {"x": 1},
                "dependencies": [],
                "max_retries": 0,
                "timeout_s": 2.5,
                "not_before_s": 0,
                "approval": False,
            },
            step("b", "a", timeout_s=1, not_before_s=0.5, approval=True),
        ],
    }
    assert set(raw) == set(SPEC_KEYS) and set(raw["steps"][0]) == set(STEP_KEYS)  # type: ignore[arg-type]
    snapshot = copy.deepcopy(raw)
    wf = parse_spec(raw)
    assert list(wf.steps) == ["a", "b"] and wf.steps["b"].dependencies == ["a"]
    assert raw == snapshot


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("timeout_s", "10", "'timeout_s' must be a number of seconds"),
        ("timeout_s", True, "'timeout_s' must be a number of seconds"),
        ("timeout_s", None, "'timeout_s' must be a number of seconds"),
        ("timeout_s", 0, "'timeout_s' must be above 0"),
        ("timeout_s", -1, "'timeout_s' must be above 0"),
        ("timeout_s", float("inf"), "'timeout_s' must be above 0"),
        ("not_before_s", [1], "'not_before_s' must be a number of seconds"),
        ("not_before_s", -0.5, "'not_before_s' must be 0 or more"),
        ("not_before_s", float("nan"), "'not_before_s' must be 0 or more"),
        ("approval", "yes", "'approval' must be true or false"),
        ("approval", 1, "'approval' must be true or false"),
    ],
)
def test_planned_keys_are_type_checked(key: str, value: object, words: str) -> None:
    with pytest.raises(WorkflowSpecError, match=rf"step 'a': {words}"):
        parse_spec({"steps": [step("a", **{key: value})]})


def test_an_unknown_action_suggests_the_nearest_one() -> None:
    with pytest.raises(UnknownActionError) as info:
        parse_spec(
            {"steps": [{"step_id": "a", "action": "calcualte"}]},
            known_actions=["calculate", "echo"],
        )
    assert "unknown action 'calcualte' (did you mean 'calculate'? known: calculate, echo)" in str(
        info.value
    )
