"""What a task message's headers must hold, and how a refused value is shown.

Celery reads these headers in the worker's main process, outside any task: one of the
wrong type (an id that is a list, a time limit that is a string, unhashable stamps)
raises there and stops the worker. Only headers Celery reads are checked; others are
left alone. A refused value is shown cut short, whatever its size or depth.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from itertools import islice

from celery.utils.time import maybe_iso8601

from state.errors import MalformedTaskMessageError
from state.workflows.spec import MAX_STEP_SECONDS

MAX_INT = 2**63 - 1  # what a BIGINT column holds
MAX_TIME_LIMIT_S = 1e6
MAX_REASON_CHARS = 400
# The furthest ahead agentstate schedules a message: a step's timer (a week at most,
# state.workflows.spec.MAX_STEP_SECONDS), plus a day. A worker holds a message with an eta in
# its main process's memory until it is due: a forged one due in years would sit there.
MAX_ETA_AHEAD_S = MAX_STEP_SECONDS + 24 * 3600.0
TASK_ID = re.compile(r"[\x21-\x7e]{1,255}")  # what fits the last_task_id columns
_SHOWN_CHARS, _SHOWN_ITEMS, _SHOWN_DEPTH, _SHOWN_TOTAL = 60, 4, 2, 200

Rule = tuple[Callable[[object], bool], str]


# -- showing a value without dumping it --------------------------------------------


def shown(value: object) -> str:
    """``value``'s type and a repr cut to a few items, two levels and 200 characters."""
    if value is None:
        return "null"
    text = f"{type(value).__name__} {_short(value, 0)}"
    return text if len(text) <= _SHOWN_TOTAL else text[: _SHOWN_TOTAL - 3] + "..."


def _short(value: object, depth: int) -> str:
    if isinstance(value, str):
        return repr(value[:_SHOWN_CHARS]) + ("..." if len(value) > _SHOWN_CHARS else "")
    if isinstance(value, dict | list | tuple):
        opening, closing = "{}" if isinstance(value, dict) else "[]"
        if depth >= _SHOWN_DEPTH and value:  # before looking inside: depth costs nothing
            return f"{opening}...{closing}"
        if isinstance(value, dict):
            pairs = islice(value.items(), _SHOWN_ITEMS)
            parts = [f"{_short(k, depth + 1)}: {_short(v, depth + 1)}" for k, v in pairs]
        else:
            parts = [_short(item, depth + 1) for item in islice(value, _SHOWN_ITEMS)]
        more = ", ..." if len(value) > _SHOWN_ITEMS else ""
        return f"{opening}{', '.join(parts)}{more}{closing}"
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<{value.bit_length()}-bit integer>"
    text = repr(value)
    return text[:_SHOWN_CHARS] + ("..." if len(text) > _SHOWN_CHARS else "")


def one_line(text: str) -> str:
    """``text`` on one line, at most MAX_REASON_CHARS long."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 3] + "..."


# -- the headers Celery reads in the worker's main process ------------------------


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _is_seconds(value: object) -> bool:
    return value is None or (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 <= value <= MAX_TIME_LIMIT_S  # NaN fails both comparisons
    )


def _is_time_limits(value: object) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2 and all(map(_is_seconds, value))


def _is_timestamp(value: object) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return False
    try:
        return maybe_iso8601(value) is not None  # Celery's own parser
    except (ValueError, OverflowError, TypeError, AttributeError):
        return False


def _is_near_timestamp(value: object) -> bool:
    if not _is_timestamp(value):
        return False
    when = maybe_iso8601(value)
    if when.tzinfo is None:  # Celery reads a naive eta as UTC
        when = when.replace(tzinfo=UTC)
    return bool((when - datetime.now(UTC)).total_seconds() <= MAX_ETA_AHEAD_S)


def _is_text_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and len(v) <= 255 for v in value)


def _text(limit: int) -> Rule:
    return (lambda v: isinstance(v, str) and len(v) <= limit), f"a string of <= {limit} chars"


def _optional(rule: Rule) -> Rule:
    accepts, meaning = rule
    return (lambda v: v is None or accepts(v)), f"null or {meaning}"


FIELD_RULES: dict[str, Rule] = {
    "id": (
        lambda v: isinstance(v, str) and TASK_ID.fullmatch(v) is not None,
        "1-255 visible ASCII characters",
    ),
    "task": _text(255),
    **{
        name: _optional(_text(1024))
        for name in ("shadow", "root_id", "parent_id", "group", "origin", "lang", "meth")
    },
    "argsrepr": _optional(_text(4096)),
    "kwargsrepr": _optional(_text(4096)),
    "eta": _optional(
        (_is_near_timestamp, f"an ISO 8601 timestamp at most {MAX_ETA_AHEAD_S:g} s ahead")
    ),
    "expires": _optional((_is_timestamp, "an ISO 8601 timestamp")),
    "retries": _optional((_is_count, "a whole number >= 0")),
    "timelimit": _optional((_is_time_limits, f"[hard, soft] of null or 0-{MAX_TIME_LIMIT_S:g} s")),
    "stamped_headers": _optional((_is_text_list, "a list of strings")),
    "stamps": _optional(((lambda v: isinstance(v, dict)), "an object")),
    "ignore_result": _optional(((lambda v: isinstance(v, bool)), "true or false")),
    "group_index": _optional((_is_count, "a whole number >= 0")),
    "replaced_task_nesting": _optional((_is_count, "a whole number >= 0")),
}


def check_fields(fields: Mapping[str, object]) -> None:
    """Refuse a message whose task id is missing or whose known headers have wrong types."""
    if "id" not in fields:
        raise MalformedTaskMessageError("the message has no task id")
    for name, (accepts, meaning) in FIELD_RULES.items():
        if name in fields and not accepts(fields[name]):
            raise MalformedTaskMessageError(
                f"header {name} must be {meaning}; got {shown(fields[name])}"
            )
