"""Workflow DAG logic: spec validation, incremental readiness, failure propagation."""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest

from state.errors import WorkflowSpecError
from state.workflow import WorkflowState, WorkflowStep, WorkflowStepStatus, transitive_dependents
from state.workflows.spec import find_cycle, parse_spec

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def step(step_id: str, *deps: str, action: str = "echo", **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "action": action, "dependencies": list(deps), **extra}


def spec(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"steps": list(steps), **extra}


def ready_ids(wf: WorkflowState) -> list[str]:
    return [s.step_id for s in wf.get_ready_steps()]


def statuses(wf: WorkflowState) -> dict[str, str]:
    return {sid: s.status.value for sid, s in wf.steps.items()}


def diamond() -> WorkflowState:
    return parse_spec(spec(step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")))


def fan(width: int) -> WorkflowState:
    middle = [step(f"m{i}", "src") for i in range(width)]
    sink = step("sink", *[f"m{i}" for i in range(width)])
    return parse_spec(spec(step("src"), *middle, sink))


# --- enum and dataclasses -------------------------------------------------------------


def test_step_status_values_are_the_seed_values() -> None:
    assert [s.value for s in WorkflowStepStatus] == [
        "pending",
        "running",
        "success",
        "failed",
        "skipped",
        "retrying",
    ]
    assert WorkflowStepStatus("retrying") is WorkflowStepStatus.RETRYING


def test_parse_spec_builds_steps_with_seed_fields() -> None:
    wf = parse_spec(
        {
            "workflow_id": "wf-1",
            "session_id": "sess-1",
            "context": {"k": 1},
            "steps": [
                {
                    "step_id": "a",
                    "action": "calculate",
                    "inputs": {"expression": "2+3"},
                    "dependencies": [],
                    "max_retries": 5,
                },
                {"step_id": "b", "action": "echo", "dependencies": ["a"]},
            ],
        },
        known_actions=["calculate", "echo"],
    )
    assert wf.workflow_id == "wf-1"
    assert wf.session_id == "sess-1"
    assert wf.context == {"k": 1}
    assert list(wf.steps) == ["a", "b"]
    a, b = wf.steps["a"], wf.steps["b"]
    assert isinstance(a, WorkflowStep)
    assert a.action == "calculate"
    assert a.inputs == {"expression": "2+3"}
    assert a.outputs == {}
    assert a.max_retries == 5
    assert a.retry_count == 0
    assert a.status is WorkflowStepStatus.PENDING
    assert a.dependents == ["b"]
    assert b.dependencies == ["a"]
    assert b.inputs == {}
    assert b.max_retries == 3  # default
    assert b.remaining_deps == 1
    assert wf.status == "running"


def test_missing_workflow_id_is_generated() -> None:
    first = parse_spec(spec(step("a")))
    second = parse_spec(spec(step("a")))
    assert ID_PATTERN.fullmatch(first.workflow_id)
    assert first.workflow_id != second.workflow_id
    assert first.session_id is None
    assert first.context == {}


# --- readiness ------------------------------------------------------------------------


def test_diamond_readiness() -> None:
    wf = diamond()
    assert ready_ids(wf) == ["a"]
    wf.start("a")
    assert wf.steps["a"].status is WorkflowStepStatus.RUNNING
    assert ready_ids(wf) == []
    newly = wf.mark_success("a", {"value": 1})
    assert [s.step_id for s in newly] == ["b", "c"]
    assert ready_ids(wf) == ["b", "c"]
    assert wf.steps["a"].outputs == {"value": 1}
    wf.start("b")
    assert ready_ids(wf) == ["c"]
    assert wf.mark_success("b", {}) == []
    assert ready_ids(wf) == ["c"]
    assert wf.steps["d"].status is WorkflowStepStatus.PENDING
    wf.start("c")
    newly = wf.mark_success("c")
    assert [s.step_id for s in newly] == ["d"]
    assert ready_ids(wf) == ["d"]
    assert wf.status == "running"
    assert not wf.is_finished()
    wf.start("d")
    assert wf.mark_success("d", {"x": 2}) == []
    assert ready_ids(wf) == []
    assert wf.is_complete()
    assert wf.is_finished()
    assert wf.status == "success"


def test_mark_success_copies_outputs() -> None:
    wf = parse_spec(spec(step("a")))
    outputs = {"value": 1}
    wf.mark_success("a", outputs)
    outputs["value"] = 2
    assert wf.steps["a"].outputs == {"value": 1}


@pytest.mark.parametrize("width", [40, 1000])
def test_fan_out_fan_in(width: int) -> None:
    wf = fan(width)
    assert ready_ids(wf) == ["src"]
    assert wf.steps["sink"].remaining_deps == width
    newly = wf.mark_success("src", {})
    assert [s.step_id for s in newly] == [f"m{i}" for i in range(width)]
    assert len(ready_ids(wf)) == width
    for i in range(width - 1):
        wf.start(f"m{i}")
        assert wf.mark_success(f"m{i}", {"i": i}) == []
        assert wf.steps["sink"].remaining_deps == width - 1 - i
    assert wf.steps["sink"].status is WorkflowStepStatus.PENDING
    assert ready_ids(wf) == [f"m{width - 1}"]
    newly = wf.mark_success(f"m{width - 1}", {})
    assert [s.step_id for s in newly] == ["sink"]
    assert ready_ids(wf) == ["sink"]
    wf.mark_success("sink", {})
    assert wf.status == "success"
    assert wf.is_complete()


def test_duplicate_success_does_not_release_dependents_early() -> None:
    # Tasks run at least once: the same success may be reported twice.
    wf = diamond()
    wf.mark_success("a", {})
    wf.mark_success("b", {"v": 1})
    again = wf.mark_success("b", {"v": 1})
    assert again == []
    assert wf.steps["d"].remaining_deps == 1
    assert ready_ids(wf) == ["c"]  # d still waits for c


def test_mark_success_only_touches_dependents() -> None:
    wf = parse_spec(
        spec(
            step("a"),
            step("b"),
            step("c", "a"),
            step("d", "a", "b"),
            step("e", "b"),
            step("f", "c"),
        )
    )
    before = {sid: (s.remaining_deps, s.status) for sid, s in wf.steps.items()}
    wf.mark_success("a", {})
    after = {sid: (s.remaining_deps, s.status) for sid, s in wf.steps.items()}
    changed = {sid for sid in before if before[sid] != after[sid]}
    assert changed == {"a", "c", "d"}
    assert after["c"] == (0, WorkflowStepStatus.PENDING)
    assert after["d"] == (1, WorkflowStepStatus.PENDING)
    assert ready_ids(wf) == ["b", "c"]


class CountingSteps(dict[str, WorkflowStep]):
    """A steps mapping that counts lookups and refuses full scans."""

    def __init__(self, steps: dict[str, WorkflowStep]) -> None:
        super().__init__(steps)
        self.lookups = 0

    def __getitem__(self, key: str) -> WorkflowStep:
        self.lookups += 1
        return super().__getitem__(key)

    def _scan(self) -> None:
        raise AssertionError("finishing a step scanned every step")

    def values(self) -> Any:
        self._scan()

    def items(self) -> Any:
        self._scan()

    def __iter__(self) -> Iterator[str]:
        self._scan()
        return iter(())


def test_finishing_a_step_costs_its_dependents_not_all_steps() -> None:
    width = 1000
    wf = fan(width)
    wf.mark_success("src", {})
    wf.steps = CountingSteps(wf.steps)
    wf.mark_success("m0", {"v": 0})
    # The step itself plus its one dependent (the sink), not a scan of ~1000 steps.
    assert wf.steps.lookups <= 2 + 1


# --- failure --------------------------------------------------------------------------


def test_failure_skips_transitive_dependents_but_not_independent_branches() -> None:
    wf = parse_spec(
        spec(
            step("root"),
            step("bad", "root"),
            step("child", "bad"),
            step("grandchild", "child"),
            step("join", "grandchild", "ok"),
            step("ok", "root"),
            step("ok2", "ok"),
            step("lonely"),
        )
    )
    wf.mark_success("root", {})
    wf.start("bad")
    skipped = wf.mark_failed("bad")
    assert {s.step_id for s in skipped} == {"child", "grandchild", "join"}
    assert statuses(wf) == {
        "root": "success",
        "bad": "failed",
        "child": "skipped",
        "grandchild": "skipped",
        "join": "skipped",
        "ok": "pending",
        "ok2": "pending",
        "lonely": "pending",
    }
    assert ready_ids(wf) == ["ok", "lonely"]
    assert wf.status == "running"
    assert not wf.is_finished()
    newly = wf.mark_success("ok", {})
    # join depended on ok too, but it was skipped: it must not become ready.
    assert [s.step_id for s in newly] == ["ok2"]
    wf.mark_success("ok2", {})
    wf.mark_success("lonely", {})
    assert ready_ids(wf) == []
    assert wf.is_finished()
    assert not wf.is_complete()  # seed semantics: a failed step is not "complete"
    assert wf.status == "failed"


def test_failure_of_a_ready_step_removes_it_and_dependents_from_ready() -> None:
    wf = diamond()
    wf.mark_success("a", {})
    skipped = wf.mark_failed("b")
    assert [s.step_id for s in skipped] == ["d"]
    assert ready_ids(wf) == ["c"]
    newly = wf.mark_success("c", {})
    assert newly == []
    assert wf.steps["d"].status is WorkflowStepStatus.SKIPPED
    assert wf.status == "failed"


def test_is_complete_counts_skipped_as_complete() -> None:
    wf = parse_spec(spec(step("a"), step("b", "a")))
    wf.steps["a"].status = WorkflowStepStatus.SUCCESS
    wf.steps["b"].status = WorkflowStepStatus.SKIPPED
    assert wf.is_complete()
    assert wf.is_finished()
    assert wf.status == "success"


@pytest.mark.parametrize(
    "status", [WorkflowStepStatus.PENDING, WorkflowStepStatus.RUNNING, WorkflowStepStatus.RETRYING]
)
def test_non_terminal_step_keeps_workflow_running(status: WorkflowStepStatus) -> None:
    wf = parse_spec(spec(step("a"), step("b")))
    wf.steps["a"].status = WorkflowStepStatus.SUCCESS
    wf.steps["b"].status = status
    assert not wf.steps["b"].is_terminal
    assert not wf.is_finished()
    assert not wf.is_complete()
    assert wf.status == "running"


def test_relinking_restored_state_recomputes_readiness() -> None:
    wf = diamond()
    wf.mark_success("a", {})
    wf.mark_success("b", {})
    steps = wf.steps
    restored = WorkflowState(workflow_id="wf", session_id=None, steps=steps)
    assert ready_ids(restored) == ["c"]
    assert restored.steps["d"].remaining_deps == 1
    assert restored.steps["a"].dependents == ["b", "c"]


def test_transitive_dependents_breadth_first_each_once() -> None:
    wf = parse_spec(
        spec(step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"), step("e", "d"))
    )
    assert transitive_dependents(wf.steps, ["a"]) == ["b", "c", "d", "e"]
    assert transitive_dependents(wf.steps, ["c"]) == ["d", "e"]
    assert transitive_dependents(wf.steps, ["e"]) == []
    assert transitive_dependents(wf.steps, ["b", "c"]) == ["d", "e"]


# --- cycles ---------------------------------------------------------------------------


def _raw_steps(edges: dict[str, list[str]]) -> dict[str, WorkflowStep]:
    return {
        sid: WorkflowStep(
            step_id=sid,
            step_name=sid,
            status=WorkflowStepStatus.PENDING,
            dependencies=deps,
            inputs={},
            outputs={},
        )
        for sid, deps in edges.items()
    }


def _assert_is_cycle(cycle: list[str], edges: dict[str, list[str]]) -> None:
    assert len(cycle) >= 3
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1
    # Read in execution order: each next id depends on the previous one.
    for before, after in itertools.pairwise(cycle):
        assert before in edges[after], f"{after} does not depend on {before}"


def test_find_cycle_on_acyclic_graph_is_empty() -> None:
    assert find_cycle(_raw_steps({"a": [], "b": ["a"], "c": ["a", "b"]})) == []


@pytest.mark.parametrize(
    "edges",
    [
        {"a": ["c"], "b": ["a"], "c": ["b"]},
        {"a": ["b"], "b": ["a"]},
        {"x": [], "a": ["x", "c"], "b": ["a"], "c": ["b"], "tail": ["c"]},
        {"z": ["y"], "y": ["z"], "q": ["z"], "free": []},
    ],
)
def test_find_cycle_returns_a_real_cycle(edges: dict[str, list[str]]) -> None:
    _assert_is_cycle(find_cycle(_raw_steps(edges)), edges)


def test_cycle_in_spec_is_named_with_arrows() -> None:
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec(spec(step("a", "c"), step("b", "a"), step("c", "b")))
    message = str(info.value)
    assert "a -> b -> c -> a" in message
    path = re.search(r"(\S+(?: -> \S+)+)", message)
    assert path is not None
    ids = path.group(1).split(" -> ")
    assert ids[0] == ids[-1]


def test_two_step_cycle_in_spec() -> None:
    with pytest.raises(WorkflowSpecError, match=r"cycle.*(a -> b -> a|b -> a -> b)"):
        parse_spec(spec(step("a", "b"), step("b", "a"), step("c")))


# --- spec errors ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, [], "steps", 3, [{"step_id": "a", "action": "echo"}]])
def test_spec_not_an_object(bad: object) -> None:
    with pytest.raises(WorkflowSpecError, match="object"):
        parse_spec(bad)


@pytest.mark.parametrize(
    "bad",
    [{}, {"steps": []}, {"steps": None}, {"steps": {}}, {"steps": "a"}, {"steps": {"a": {}}}],
)
def test_missing_or_empty_steps(bad: dict[str, Any]) -> None:
    with pytest.raises(WorkflowSpecError, match="steps"):
        parse_spec(bad)


@pytest.mark.parametrize("bad", [None, "a", 1, ["a"]])
def test_step_not_an_object(bad: object) -> None:
    with pytest.raises(WorkflowSpecError, match=r"step #2 must be a JSON object"):
        parse_spec(spec(step("a"), bad))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad_id",
    [
        "",
        "x" * 129,
        "a b",
        " a",
        "a/b",
        "é",
        "日本",
        "a\n",
        "a*b",
        None,
        7,
        ["a"],
    ],
)
def test_invalid_step_ids(bad_id: object) -> None:
    with pytest.raises(WorkflowSpecError, match=r"step #1.*invalid step id"):
        parse_spec(spec({"step_id": bad_id, "action": "echo"}))


def test_missing_step_id() -> None:
    with pytest.raises(WorkflowSpecError, match=r"step #1.*invalid step id"):
        parse_spec(spec({"action": "echo"}))


@pytest.mark.parametrize("good_id", ["a", "x" * 128, "A.b_c-9", "0", "..."])
def test_valid_step_ids(good_id: str) -> None:
    assert list(parse_spec(spec(step(good_id))).steps) == [good_id]


@pytest.mark.parametrize("bad_id", ["A.b_c:d-9", ":", "067b40:charge", "a:"])
def test_step_ids_may_not_contain_a_colon(bad_id: str) -> None:
    # "{workflow_id}:{step_id}" is a step's idempotency key: with a ':' in step ids,
    # workflow "p:067b40" step "charge" and workflow "p" step "067b40:charge" would share it.
    with pytest.raises(WorkflowSpecError, match="may not contain ':'"):
        parse_spec(spec(step(bad_id)))


def test_the_step_key_names_one_step() -> None:
    from state.ids import step_key

    assert step_key("p:067b40", "charge") == "p:067b40:charge"
    assert step_key("p:067b40", "charge").rsplit(":", 1) == ["p:067b40", "charge"]


def test_duplicate_step_ids() -> None:
    with pytest.raises(WorkflowSpecError, match=r"duplicate step id 'a'"):
        parse_spec(spec(step("a"), step("b"), step("a")))


@pytest.mark.parametrize("action", [None, "", 3, ["echo"]])
def test_missing_or_bad_action(action: object) -> None:
    raw: dict[str, Any] = {"step_id": "s1"}
    if action is not None:
        raw["action"] = action
    with pytest.raises(WorkflowSpecError, match=r"'s1'.*action"):
        parse_spec(spec(raw))


def test_unknown_action_lists_the_known_ones() -> None:
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec(
            spec(step("a", action="echo"), step("b", action="teleport")),
            known_actions=["sleep", "echo", "calculate"],
        )
    message = str(info.value)
    assert "'b'" in message
    assert "teleport" in message
    for known in ("calculate", "echo", "sleep"):
        assert known in message


def test_any_action_is_accepted_without_known_actions() -> None:
    wf = parse_spec(spec(step("a", action="teleport")))
    assert wf.steps["a"].action == "teleport"


@pytest.mark.parametrize("inputs", [[], "x", 1, None])
def test_inputs_not_an_object(inputs: object) -> None:
    with pytest.raises(WorkflowSpecError, match=r"'a'.*'inputs' must be a JSON object"):
        parse_spec(spec(step("a", inputs=inputs)))


@pytest.mark.parametrize("deps", ["b", {"b": 1}, [1], ["b", None], None, [["b"]]])
def test_dependencies_not_a_list_of_strings(deps: object) -> None:
    with pytest.raises(WorkflowSpecError, match=r"'a'.*'dependencies' must be a list"):
        parse_spec(spec(step("b"), {"step_id": "a", "action": "echo", "dependencies": deps}))


def test_duplicate_dependency() -> None:
    with pytest.raises(WorkflowSpecError, match="twice"):
        parse_spec(spec(step("b"), step("a", "b", "b")))


def test_dangling_dependency() -> None:
    with pytest.raises(WorkflowSpecError) as info:
        parse_spec(spec(step("a"), step("b", "a", "ghost")))
    message = str(info.value)
    assert "'b'" in message
    assert "'ghost'" in message
    assert "not a step" in message


def test_self_dependency() -> None:
    with pytest.raises(WorkflowSpecError, match=r"'a' depends on itself"):
        parse_spec(spec(step("a", "a")))


def test_more_than_max_steps() -> None:
    steps = [step(f"s{i}") for i in range(4)]
    with pytest.raises(WorkflowSpecError, match=r"4 steps.*limit is 3"):
        parse_spec(spec(*steps), max_steps=3)
    assert len(parse_spec(spec(*steps), max_steps=4).steps) == 4


def test_default_max_steps_is_10000() -> None:
    with pytest.raises(WorkflowSpecError, match="10000"):
        parse_spec({"steps": [{}] * 10_001})


@pytest.mark.parametrize("value", ["3", 1.5, 3.0, None, True, False, [3]])
def test_max_retries_not_an_int(value: object) -> None:
    with pytest.raises(WorkflowSpecError, match=r"'a'.*'max_retries' must be an integer"):
        parse_spec(spec(step("a", max_retries=value)))


@pytest.mark.parametrize("value", [-1, 101, 10**9])
def test_max_retries_out_of_range(value: int) -> None:
    with pytest.raises(WorkflowSpecError, match=r"'a'.*'max_retries' must be 0-100"):
        parse_spec(spec(step("a", max_retries=value)))


@pytest.mark.parametrize("value", [0, 100])
def test_max_retries_bounds_are_allowed(value: int) -> None:
    assert parse_spec(spec(step("a", max_retries=value))).steps["a"].max_retries == value


@pytest.mark.parametrize("context", [[], "x", 1, None])
def test_context_not_an_object(context: object) -> None:
    with pytest.raises(WorkflowSpecError, match="'context' must be a JSON object"):
        parse_spec(spec(step("a"), context=context))


@pytest.mark.parametrize("key", ["workflow_id", "session_id"])
@pytest.mark.parametrize("value", ["", "a b", "x" * 129, "a/b", "é", 5, ["a"]])
def test_invalid_workflow_or_session_id(key: str, value: object) -> None:
    kind = key.removesuffix("_id")
    with pytest.raises(WorkflowSpecError, match=f"invalid {kind} id"):
        parse_spec(spec(step("a"), **{key: value}))


@pytest.mark.parametrize(
    "raw",
    [
        spec(step("a", inputs={"x": [1]}), step("b", "a"), context={"k": {"v": 1}}),
        spec(step("a"), step("b", "c"), step("c", "b")),
    ],
)
def test_parse_spec_does_not_mutate_the_spec(raw: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(raw)
    with contextlib.suppress(WorkflowSpecError):
        parse_spec(raw)
    assert raw == snapshot
