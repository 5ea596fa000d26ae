"""The one rule for ids of sessions, users, workflows and steps."""

from __future__ import annotations

import re
import uuid

from state.errors import InvalidIdError

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def validate_id(value: object, kind: str) -> str:
    """Return ``value`` if it is a valid id, else raise InvalidIdError naming ``kind``."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise InvalidIdError(
            f"invalid {kind} id {shown}: use 1-{MAX_ID_LENGTH} letters, digits or ._:-"
        )
    return value


def new_id(prefix: str) -> str:
    """A fresh random id such as ``wf-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


STEP_KEY_SEPARATOR = ":"


def step_key(workflow_id: str, step_id: str) -> str:
    """A step's idempotency key, ``"{workflow_id}:{step_id}"``: the same for every
    delivery and retry of it, and one step's only (a step id has no ':', so the key
    splits at its last ':' one way)."""
    return f"{workflow_id}{STEP_KEY_SEPARATOR}{step_id}"
