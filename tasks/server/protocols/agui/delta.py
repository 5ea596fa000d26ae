"""``STATE_DELTA``: the session's state as a JSON Patch (RFC 6902) against the state the
client sent with its run (``RunAgentInput.state``, the state it holds), sent instead of a
``STATE_SNAPSHOT`` when the patch is the smaller of the two. Objects are compared key by
key (nested ones recursively); any other value that changed is replaced whole."""

from __future__ import annotations

from typing import Any

from state.documents import codec
from state.documents.codec import Document


def _pointer(path: str, key: str) -> str:
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


def _same(a: Any, b: Any) -> bool:
    # JSON tells 1 from true and 1 from 1.0 by type; Python's == does not.
    return type(a) is type(b) and codec.dumps(a) == codec.dumps(b)


def diff(old: Document, new: Document, path: str = "") -> list[Document]:
    """The JSON Patch operations that turn ``old`` into ``new``."""
    ops: list[Document] = [
        {"op": "remove", "path": _pointer(path, key)} for key in old if key not in new
    ]
    for key, value in new.items():
        where = _pointer(path, key)
        if key not in old:
            ops.append({"op": "add", "path": where, "value": value})
        elif _same(old[key], value):
            continue
        elif isinstance(old[key], dict) and isinstance(value, dict):
            ops.extend(diff(old[key], value, where))
        else:
            ops.append({"op": "replace", "path": where, "value": value})
    return ops


def cheaper_delta(held: Any, state: Document) -> list[Document] | None:
    """The patch from the client's ``held`` state to ``state``, if the client holds one
    (a non-empty object) and the patch is shorter than the whole state; else None."""
    if not isinstance(held, dict) or not held:
        return None
    ops = diff(held, state)
    return ops if len(codec.dumps(ops)) < len(codec.dumps(state)) else None
