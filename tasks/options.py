"""Retry policy shared by every agentstate task.

Infrastructure errors (Redis or the database not answering, a lock that stays busy) are
retried with bounded, jittered exponential backoff whose base is AGENTSTATE_RETRY_BACKOFF.
Logic never retries itself: a duplicate or stale delivery is dropped, not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError

from config import get_settings, redact_url
from state.errors import ServiceUnavailableError, StateLockAcquisitionError
from state.workflow_engine import retry_delay_s

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_TASK_RETRIES = 30
MAX_TASK_RETRY_DELAY_S = 30.0

# Redis or the database did not answer, or the lock stayed busy: try again later.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    OperationalError,
    InterfaceError,
    ServiceUnavailableError,
    StateLockAcquisitionError,
    BrokerError,
)

# Malformed broker messages are refused before Celery unpacks them (tasks/guard.py).
GUARD_STRATEGY = "tasks.guard:strategy"

TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "max_retries": MAX_TASK_RETRIES,
    "Strategy": GUARD_STRATEGY,
}


def with_retries(task: Any, call: Callable[[], T]) -> T:
    """Run ``call``; on a transient error schedule a retry of ``task`` (same task id)."""
    try:
        return call()
    except TRANSIENT_ERRORS as exc:
        attempt = task.request.retries
        delay = min(MAX_TASK_RETRY_DELAY_S, retry_delay_s(get_settings().retry_backoff, attempt))
        logger.warning(
            "%s[%s] hit %s; retry %d/%d in %.2fs: %s",
            task.name,
            task.request.id,
            type(exc).__name__,
            attempt + 1,
            MAX_TASK_RETRIES,
            delay,
            redact_url(str(exc)),
        )
        raise task.retry(exc=exc, countdown=delay) from exc
