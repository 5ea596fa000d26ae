"""JSON in and out (orjson): the only serialization agentstate uses."""

from __future__ import annotations

import re
from typing import Any

import orjson

from state.errors import (
    CorruptStateError,
    EmptyMessageError,
    InvalidPayloadError,
    MessageTooLargeError,
)

# A JSON object as Python holds it: every state document, payload and result.
Document = dict[str, Any]

# An escaped NUL: "\u0000" preceded by an even number of backslashes.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps(value: Any) -> str:
    """Serialize ``value`` to a JSON string; non-JSON values raise InvalidPayloadError."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise InvalidPayloadError(f"value is not JSON-serializable: {exc}") from exc


def loads(raw: str | bytes) -> Any:
    """Parse JSON text."""
    return orjson.loads(raw)


def require_object(value: Any, what: str) -> Document:
    """Return ``value`` if it is a JSON object every backend can store, else raise."""
    if not isinstance(value, dict):
        raise InvalidPayloadError(f"{what} must be a JSON object, got {type(value).__name__}")
    require_storable(value, what)
    return value


def require_storable(value: Any, what: str) -> str:
    """``value`` as JSON, refusing what some backend cannot store (NUL characters:
    Postgres refuses them in text and JSONB; unpaired surrogates: not UTF-8) and what
    JSON cannot hold (NaN and infinities, which orjson would silently store as null)."""
    try:
        text = dumps(value)
    except InvalidPayloadError as exc:
        raise InvalidPayloadError(f"{what} is not storable JSON: {exc}") from exc
    # The substring test (C speed) first: every match of the pattern contains it.
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidPayloadError(f"{what} contains a NUL character")
    # orjson has no option to refuse them, and writes each as null: without a null in
    # the text there is none, and most payloads are never walked.
    if "null" in text and _has_non_finite(value):
        raise InvalidPayloadError(
            f"{what} contains a number that is not finite (NaN or Infinity); JSON has none"
        )
    return text


def _has_non_finite(value: Any) -> bool:
    # One pass, no recursion (orjson has already refused nesting deeper than 255).
    pending: list[Any] = [[value]]
    while pending:
        item = pending.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, float):
                if child - child != 0.0:  # nan - nan and inf - inf are nan
                    return True
            elif isinstance(child, dict | list | tuple):
                pending.append(child)
    return False


def json_size(value: Any, what: str) -> int:
    """How many bytes ``value`` takes as JSON (InvalidPayloadError if it is not JSON)."""
    try:
        return len(orjson.dumps(value))
    except TypeError as exc:
        raise InvalidPayloadError(f"{what} is not storable JSON: {exc}") from exc


def too_large(what: str, size: int, limit: int, setting: str) -> str:
    """The one line that refuses ``what`` for its size, naming the setting."""
    return f"{what} is {size} bytes; the limit is {limit} ({setting})"


def require_text(text: Any, what: str, max_bytes: int) -> int:
    """Check a message: a string of valid UTF-8 text, not only whitespace, no NUL, at
    most ``max_bytes``."""
    if not isinstance(text, str):
        raise InvalidPayloadError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise EmptyMessageError(f"{what} is empty (or only whitespace): there is nothing to answer")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPayloadError(f"{what} is not valid text ({exc.reason})") from exc
    if "\x00" in text:
        raise InvalidPayloadError(f"{what} contains a NUL character")
    if size > max_bytes:
        raise MessageTooLargeError(
            f"{what} is {size} bytes; the limit is {max_bytes} (AGENTSTATE_MAX_MESSAGE_BYTES)"
        )
    return size


def decode_document(raw: str | bytes) -> Document:
    """Parse a stored state document; anything but a JSON object is CorruptStateError."""
    try:
        doc = orjson.loads(raw)
    except ValueError as exc:
        raise CorruptStateError(f"state is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptStateError(f"state is a {type(doc).__name__}, not an object")
    return doc
