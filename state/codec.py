"""JSON in and out (orjson): the only serialization agentstate uses."""

from __future__ import annotations

from typing import Any

import orjson

from state.errors import CorruptStateError, InvalidPayloadError


def dumps(value: Any) -> str:
    """Serialize ``value`` to a JSON string; non-JSON values raise InvalidPayloadError."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise InvalidPayloadError(f"value is not JSON-serializable: {exc}") from exc


def loads(raw: str | bytes) -> Any:
    """Parse JSON text."""
    return orjson.loads(raw)


def require_object(value: Any, what: str) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object that round-trips, else raise."""
    if not isinstance(value, dict):
        raise InvalidPayloadError(f"{what} must be a JSON object, got {type(value).__name__}")
    dumps(value)
    return value


def decode_document(raw: str | bytes) -> dict[str, Any]:
    """Parse a stored state document; anything but a JSON object is CorruptStateError."""
    try:
        doc = orjson.loads(raw)
    except ValueError as exc:
        raise CorruptStateError(f"state is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptStateError(f"state is a {type(doc).__name__}, not an object")
    return doc
