"""What the codec lets reach storage: JSON every backend stores as given, nothing else."""

from __future__ import annotations

import math
import time
from typing import Any

import orjson
import pytest

from state.documents.codec import require_object, require_storable
from state.errors import InvalidPayloadError, WorkflowSpecError
from state.workflows.spec import parse_spec

NAN, INF = float("nan"), float("inf")


def _deep(leaf: Any, depth: int) -> Any:
    for index in range(depth):
        leaf = {"k": leaf} if index % 2 else [leaf]
    return leaf


@pytest.mark.parametrize(
    "value",
    [
        NAN,
        INF,
        -INF,
        [NAN],
        {"a": INF},
        {"a": [1, 2, {"b": -INF}]},
        {"a": (1, NAN)},
        {"a": None, "b": [None, 1.5, NAN]},
        [1e308 * 10],
        {"x": 0.0 * INF},
        _deep(NAN, 200),
        [[None] * 1000, {"z": INF}],
    ],
)
def test_non_finite_numbers_are_refused_not_stored_as_null(value: Any) -> None:
    assert b"null" in orjson.dumps(value)  # what would have been stored
    with pytest.raises(InvalidPayloadError, match=r"^the thing contains a number that is not"):
        require_storable(value, "the thing")


@pytest.mark.parametrize(
    "value",
    [
        None,
        [None],
        "null",
        {"null": "null", "nan": "NaN", "inf": "Infinity"},
        {"a": 1e308, "b": -1e308, "c": -0.0, "d": 5e-324, "e": None},
        [0.1, 2**63 - 1, -(2**63), True, False, None],
        _deep(1.5, 200),
    ],
)
def test_finite_json_is_stored_exactly_as_before(value: Any) -> None:
    assert require_storable(value, "v") == orjson.dumps(value).decode()


def test_user_state_with_nan_is_refused() -> None:
    with pytest.raises(InvalidPayloadError, match="user state contains a number that is not"):
        require_object({"memories": [], "score": NAN}, "user state")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"steps": [{"step_id": "a", "action": "echo", "inputs": {"x": NAN}}]}, "'inputs'"),
        ({"steps": [{"step_id": "a", "action": "echo", "inputs": {"x": [INF]}}]}, "'inputs'"),
        ({"steps": [{"step_id": "a", "action": "echo"}], "context": {"t": -INF}}, "'context'"),
    ],
)
def test_a_spec_with_non_finite_numbers_is_a_spec_error(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(WorkflowSpecError, match=f"{words} contains a number that is not finite"):
        parse_spec(spec)


def test_a_megabyte_payload_is_checked_at_once() -> None:
    # The walk runs only when the text has a null, and then once: a hang guard, not a
    # benchmark (about 15 ms here).
    rows = [{"a": i, "b": "x" * 5, "c": None, "d": 1.5} for i in range(25_000)]
    assert len(orjson.dumps(rows)) > 1_000_000
    started = time.perf_counter()
    require_storable(rows, "rows")
    assert time.perf_counter() - started < 1.0
    rows[-1]["d"] = math.nan
    with pytest.raises(InvalidPayloadError):
        require_storable(rows, "rows")
