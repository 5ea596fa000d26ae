"""The one base class of every agentstate Celery task: delivery guarantees, the retry
policy for infrastructure errors, and what a stale delivery does.

Celery ``Task`` attributes set here (see Celery's "Task options"):

- ``acks_late = True``: the broker message is acknowledged after the task ran, so a task
  whose worker dies is delivered again (at least once). Each task carries the revision it
  expects, so the repeat changes nothing twice.
- ``reject_on_worker_lost = True``: a task whose worker process was killed goes back to
  the queue instead of being acknowledged as failed.
- ``Strategy``: how the worker turns a broker message into a task request. Ours
  (``tasks.worker.guard.strategy``) refuses a malformed message (wrong body shape, wrong
  argument types, bad ids) on one log line, without requeue, instead of letting Celery
  crash the worker on it; a good message goes on to Celery's default strategy.
- ``max_retries``: how often a task retries Redis, the database or the broker not
  answering (or a lock staying busy), with jittered exponential backoff whose base is
  AGENTSTATE_RETRY_BACKOFF. Logic never retries itself: a duplicate or stale delivery
  is dropped, not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from celery import Task
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError

from config import get_settings, redact_url
from config.brokers import broker_for
from state.errors import (
    ServiceUnavailableError,
    StaleStateError,
    StateLockAcquisitionError,
    WorkFailedError,
)
from state.workflows.retries import retry_delay_s
from tasks.worker.guard import GUARD_STRATEGY

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


class AgentStateTask(Task):  # type: ignore[misc]
    """Base of every ``agentstate.*`` task (see the module docstring)."""

    abstract = True
    Strategy = GUARD_STRATEGY
    acks_late = True
    reject_on_worker_lost = True
    max_retries = MAX_TASK_RETRIES
    # Work that ended failed (an apology turn, a failed step) raises WorkFailedError after
    # its commit, so Flower shows FAILURE; an expected failure, logged without traceback
    # (the handler's or action's own traceback was logged where it raised).
    throws = (WorkFailedError,)

    @property
    def repeated(self) -> bool:
        """Whether this delivery is a retry or a redelivery (its first run may have
        committed without our knowing)."""
        request = self.request
        return bool(request.retries) or bool((request.delivery_info or {}).get("redelivered"))

    @property
    def redelivered(self) -> bool:
        """Whether the broker delivers this message again because the worker that had it
        was lost (evidence, unlike a retry, that the task may have killed its worker)."""
        return bool((self.request.delivery_info or {}).get("redelivered"))

    def attempt(self, call: Callable[[], T], on_stale: Callable[[StaleStateError], T]) -> T:
        """Run ``call``; retry this task later on a transient error; a delivery that lost
        a race to another writer is dropped with ``on_stale``'s result."""
        try:
            return call()
        except StaleStateError as exc:
            kinds = [c.__name__ for c in type(exc).__mro__ if issubclass(c, StaleStateError)]
            logger.info(
                "%s[%s] lost a race and was dropped (%s): %s",
                self.name,
                self.request.id,
                ", ".join(kinds),
                exc,
            )
            return on_stale(exc)
        except TRANSIENT_ERRORS as exc:
            raise self._retry_later(exc) from exc

    def _retry_later(self, exc: BaseException) -> BaseException:
        attempt = self.request.retries
        settings = get_settings()
        delay = min(MAX_TASK_RETRY_DELAY_S, retry_delay_s(settings.retry_backoff, attempt))
        delay = broker_for(settings).countdown(delay)
        logger.warning(
            "%s[%s] hit %s; retry %d/%d in %.2fs: %s",
            self.name,
            self.request.id,
            type(exc).__name__,
            attempt + 1,
            MAX_TASK_RETRIES,
            delay,
            redact_url(str(exc)),
        )
        retry: BaseException = self.retry(exc=exc, countdown=delay)
        return retry


def stale_result(**fields: Any) -> Callable[[StaleStateError], dict[str, Any]]:
    """An ``on_stale`` that reports ``status: stale`` with ``fields``."""
    return lambda _exc: {**fields, "status": "stale"}
