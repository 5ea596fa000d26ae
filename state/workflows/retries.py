"""When a failed attempt runs again: backoff, and which failures another attempt may fix.

Shared by workflow steps (``state.workflows.engine``) and the tasks' own retries on
transient errors (``tasks.worker.base``).
"""

from __future__ import annotations

import random

MAX_BACKOFF_S = 300.0


def retry_delay_s(base_s: float, retries_done: int) -> float:
    """Exponential backoff with jitter: about base, 2*base, 4*base, ... (capped)."""
    delay = min(MAX_BACKOFF_S, base_s * 2**retries_done)
    return float(delay * random.uniform(0.5, 1.0))


def retryable(exc: BaseException) -> bool:
    """Whether another attempt may help: not for PermanentActionError, CalculationError
    or any exception whose class says ``retryable = False``."""
    return getattr(exc, "retryable", True) is not False
