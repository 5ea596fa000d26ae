"""The revision patches: apply(old, diff(old, new)) == new, compactly, for JSON values."""

from __future__ import annotations

import random
from typing import Any

from state.documents import codec
from state.events.revisions import apply, diff

_LEAVES = [0, 1, 2, 0.0, 1.0, 2.5, True, False, None, "", "a", "b"]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["leaf", "leaf", "list", "dict"] if depth < 3 else ["leaf"])
    if kind == "leaf":
        return rng.choice(_LEAVES)
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice("abcd"): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_apply_of_diff_rebuilds_the_new_document_exactly() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        old, new = _random_value(rng, 1), _random_value(rng, 1)
        if not isinstance(old, dict) or not isinstance(new, dict):
            continue
        patch = codec.loads(codec.dumps(diff(old, new)))  # it is stored as JSON
        rebuilt = apply(old, patch)
        assert codec.dumps(rebuilt) == codec.dumps(new) or _same_keys_reordered(rebuilt, new)


def _same_keys_reordered(a: Any, b: Any) -> bool:
    return codec.loads(codec.dumps(a)) == codec.loads(codec.dumps(b)) and _types(a) == _types(b)


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_one_true_and_one_point_zero_are_different_values() -> None:
    old = {"a": 1, "b": {"c": 1.0}, "d": [1]}
    new = {"a": True, "b": {"c": 1}, "d": [True]}
    rebuilt = apply(old, diff(old, new))
    assert _types(rebuilt) == _types(new)


def test_a_patch_holds_only_what_changed() -> None:
    old = {"big": "x" * 1000, "meta": {"turn": {"path": ["idle"]}, "keep": "y" * 500}, "n": 1}
    new = {"big": "x" * 1000, "meta": {"turn": {"path": ["idle", "planning"]}, "keep": "y" * 500}}
    patch = diff(old, new)
    assert patch == {"meta": ["~", {"turn": ["~", {"path": ["+", ["planning"]]}]}], "n": ["-"]}
    assert apply(old, patch) == new
    assert diff(new, new) == {}


def test_a_string_enum_equals_its_text() -> None:
    from state.machine import Phase

    assert diff({"phase": "idle"}, {"phase": Phase.IDLE}) == {}
    assert diff({"path": ["idle"]}, {"path": []}) == {"path": ["=", []]}
