"""``STATE_DELTA``'s JSON Patch, checked by applying it with the ``jsonpatch`` package (an
RFC 6902 implementation of its own): nested objects patched key by key, pointers escaped,
JSON types told apart, and the patch offered only when smaller than the state."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from tasks.server.protocols.agui.delta import cheaper_delta, diff

CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 1}),
    ({"a": {"x": 1, "y": [1, 2]}}, {"a": {"x": 2, "y": [1, 2], "z": None}}),
    ({"a/b": 1, "c~d": {"e": 1}}, {"a/b": 2, "c~d": {"e": 2}}),
    ({"flag": 1}, {"flag": True}),
    ({"n": 1}, {"n": 1.0}),
    ({"a": {"x": 1}}, {"a": [1]}),
]


@pytest.mark.parametrize(("old", "new"), CASES)
def test_the_patch_turns_the_old_state_into_the_new(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    patched = jsonpatch.apply_patch(old, diff(old, new))
    assert patched == new
    assert [type(v) for v in patched.values()] == [type(v) for v in new.values()]


def test_a_delta_only_when_the_client_holds_a_state_and_it_is_smaller() -> None:
    state = {"phase": "idle", "notes": "x" * 200, "revision": 7}
    assert cheaper_delta({}, state) is None
    assert cheaper_delta(None, state) is None
    assert cheaper_delta({**state, "revision": 6}, state) == [
        {"op": "replace", "path": "/revision", "value": 7}
    ]
    assert cheaper_delta(state, state) == []
    assert cheaper_delta({"other": 1}, {"phase": "idle"}) is None
