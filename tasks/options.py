"""Retry policy shared by every agentstate task: infrastructure errors are retried with
bounded, jittered backoff; the logic never retries itself."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy.exc import InterfaceError, OperationalError

from state.errors import ServiceUnavailableError, StateLockAcquisitionError

# Redis or the database did not answer, or the lock stayed busy: try again later.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    OperationalError,
    InterfaceError,
    ServiceUnavailableError,
    StateLockAcquisitionError,
)

TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 30,
    "acks_late": True,
    "reject_on_worker_lost": True,
}
