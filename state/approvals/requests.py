"""What a handler may ask a person to approve, checked before anything is stored."""

from __future__ import annotations

import math
from dataclasses import dataclass

from state.documents import codec
from state.documents.codec import Document
from state.errors import InvalidPayloadError

MAX_ACTION_CHARS = 128
# An approval nobody decides within a year is a leak, not a question.
MAX_TTL_S = 366 * 86400.0
_KEYS = frozenset({"action", "args", "ttl_s"})


@dataclass(frozen=True)
class ApprovalRequest:
    """One approval to ask for.

    Attributes:
        action: what will be done if approved (a short name shown to the person).
        args: its arguments, a JSON object shown with it.
        ttl_s: seconds the request waits before it is rejected as expired.
    """

    action: str
    args: Document
    ttl_s: float

    @classmethod
    def parse(cls, raw: object, *, default_ttl_s: float, max_args_bytes: int) -> ApprovalRequest:
        """The request ``raw`` (``PhaseResult.approval``) describes, or InvalidPayloadError
        naming what is wrong."""
        if not isinstance(raw, dict):
            raise InvalidPayloadError("an approval must be an object with 'action' and 'args'")
        unknown = sorted(str(k) for k in raw if k not in _KEYS)
        if unknown:
            raise InvalidPayloadError(f"an approval has no key {unknown[0]!r:.60}")
        return cls(
            action=_action(raw.get("action")),
            args=_args(raw.get("args", {}), max_args_bytes),
            ttl_s=_ttl(raw.get("ttl_s", default_ttl_s)),
        )


def _action(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ACTION_CHARS or "\x00" in value:
        raise InvalidPayloadError(
            f"an approval's 'action' must be 1-{MAX_ACTION_CHARS} characters of text"
        )
    return value


def _args(value: object, max_bytes: int) -> Document:
    if not isinstance(value, dict):
        raise InvalidPayloadError("an approval's 'args' must be a JSON object")
    text = codec.require_storable(value, "an approval's 'args'")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidPayloadError(
            codec.too_large("an approval's 'args'", size, max_bytes, "AGENTSTATE_MAX_STEP_IO_BYTES")
        )
    args: Document = codec.loads(text)
    return args


def _ttl(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPayloadError("an approval's 'ttl_s' must be a number of seconds")
    ttl = float(value)
    if not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL_S:
        raise InvalidPayloadError(
            f"an approval's 'ttl_s' must be above 0 and at most {MAX_TTL_S:g}"
        )
    return ttl
