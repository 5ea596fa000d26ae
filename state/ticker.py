"""One background thread per process that calls registered callbacks periodically.

Lock renewal and step-lease heartbeats use it, so holding a lock or running a step
costs a dict insert, not a thread start. Quick work is done before its first tick.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 3600.0


@dataclass
class _Entry:
    period_s: float
    callback: Callable[[], bool]
    due: float


class Ticker:
    """Calls each registered callback every ``period_s`` until it returns False."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entries: dict[str, _Entry] = {}
        self._cond = threading.Condition()
        self._pid = 0
        self._wake_at = 0.0  # when the thread next looks by itself (0: it is looking now)

    def register(self, key: str, period_s: float, callback: Callable[[], bool]) -> None:
        """Call ``callback`` every ``period_s`` (first call after one period)."""
        with self._cond:
            if self._pid != os.getpid():  # threads do not survive a fork
                self._pid = os.getpid()
                self._entries.clear()
                threading.Thread(target=self._run, name=self.name, daemon=True).start()
            entry = _Entry(period_s, callback, time.monotonic() + period_s)
            self._entries[key] = entry
            if entry.due < self._wake_at:  # only wake the thread if it would sleep past this
                self._cond.notify()

    def unregister(self, key: str) -> None:
        """Stop calling the callback registered under ``key``."""
        with self._cond:
            self._entries.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [(k, e) for k, e in self._entries.items() if e.due <= now]
                if not due:
                    self._wake_at = min(
                        (e.due for e in self._entries.values()), default=now + _IDLE_WAIT_S
                    )
                    self._cond.wait(timeout=self._wake_at - now)
                    self._wake_at = 0.0
                    continue
                for _, entry in due:
                    entry.due = now + entry.period_s
            for key, entry in due:
                self._call(key, entry)

    def _call(self, key: str, entry: _Entry) -> None:
        try:
            keep = entry.callback()
        except Exception:
            logger.exception("%s: callback %s failed", self.name, key)
            keep = True
        if not keep:
            self.unregister(key)
