"""JSON in and out (orjson): the only serialization agentstate uses."""

from __future__ import annotations

from typing import Any

import orjson

from state.errors import InvalidPayloadError


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
