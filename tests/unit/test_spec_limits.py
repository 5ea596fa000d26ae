"""Workflow specs past a size limit are refused cheaply, before any graph is built."""

from __future__ import annotations

import time
from typing import Any

import pytest

from config import Settings
from state.errors import WorkflowSpecError
from state.workflows.spec import SpecLimits, parse_spec

DEFAULTS = SpecLimits.from_settings(Settings())
HANG_GUARD_S = 10.0  # the old parser took minutes on these; a hang, not a benchmark


def _dense(steps: int, fan_in: int) -> dict[str, Any]:
    """``steps`` steps, each after the first ``fan_in`` depending on all of those."""
    roots = [f"s{i}" for i in range(fan_in)]
    return {
        "steps": [
            {"step_id": f"s{i}", "action": "echo", "dependencies": [] if i < fan_in else roots}
            for i in range(steps)
        ]
    }


def test_the_defaults_are_the_documented_ones() -> None:
    assert (DEFAULTS.max_bytes, DEFAULTS.max_links, DEFAULTS.max_step_io_bytes) == (
        1 << 20,
        100_000,
        1 << 20,
    )


def test_a_million_links_are_refused_before_the_graph_is_built() -> None:
    spec = _dense(2500, 500)  # 1,000,000 links
    unbounded_bytes = SpecLimits(1 << 30, DEFAULTS.max_links, DEFAULTS.max_step_io_bytes)
    started = time.perf_counter()
    with pytest.raises(WorkflowSpecError, match=r"1000000 dependency links.*SPEC_LINKS"):
        parse_spec(spec, limits=unbounded_bytes)
    with pytest.raises(WorkflowSpecError, match="AGENTSTATE_MAX_SPEC_BYTES"):
        parse_spec(spec)  # by default its 7 MB are refused first
    assert time.perf_counter() - started < HANG_GUARD_S


def test_links_up_to_the_limit_are_accepted() -> None:
    wf = parse_spec(_dense(30, 5), limits=SpecLimits(1 << 20, 125, 1 << 20))
    assert sum(len(s.dependencies) for s in wf.steps.values()) == 125
    with pytest.raises(WorkflowSpecError, match="126 dependency links; the limit is 125"):
        parse_spec(
            _dense(30, 5) | {"steps": [*_dense(30, 5)["steps"], _extra()]},
            limits=SpecLimits(1 << 20, 125, 1 << 20),
        )


def _extra() -> dict[str, Any]:
    return {"step_id": "extra", "action": "echo", "dependencies": ["s0"]}


def test_a_hundred_megabytes_of_inputs_are_refused_at_once() -> None:
    spec = {"steps": [{"step_id": "a", "action": "echo", "inputs": {"x": "y" * 105_000_000}}]}
    started = time.perf_counter()
    with pytest.raises(WorkflowSpecError) as refused:
        parse_spec(spec)
    assert time.perf_counter() - started < HANG_GUARD_S
    message = str(refused.value)
    assert message.startswith("workflow spec is 1050000") and "AGENTSTATE_MAX_SPEC_BYTES" in message
    assert "\n" not in message


def test_one_steps_inputs_are_bounded_on_their_own() -> None:
    limits = SpecLimits(1 << 20, 100, 100)
    ok = {"step_id": "a", "action": "echo", "inputs": {"x": "y" * 90}}
    parse_spec({"steps": [ok]}, limits=limits)
    big = {"step_id": "b", "action": "echo", "inputs": {"x": "\u00e9" * 50}}  # 100+ bytes
    with pytest.raises(WorkflowSpecError, match=r"step 'b': 'inputs' is 108 bytes; the limit "):
        parse_spec({"steps": [ok, big]}, limits=limits)


def test_a_spec_that_is_not_json_is_one_clear_error() -> None:
    with pytest.raises(WorkflowSpecError, match="not storable JSON"):
        parse_spec({"steps": [{"step_id": "a", "action": "echo", "inputs": {"s": {1, 2}}}]})
