"""What the domain tells operators about, without knowing who listens.

``state`` imports no metrics library: it reports to the process's :class:`Observer`, a
no-op until a worker (or ``agentstate serve``) installs one that counts
(``tasks.observability.metrics``). The calls sit where the event happens, each a method
call on a module global, so with nobody listening they cost next to nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Observer(Protocol):
    """Receives the domain's operational events (each call must be cheap: no I/O)."""

    def lock_waited(self, seconds: float) -> None:
        """A phase waited ``seconds`` for its session's lock (and the cache read with it)."""

    def commit_refused(self, what: str) -> None:
        """A guarded commit was refused (fencing): ``what`` is ``session``, ``lock_lost``
        or ``step``."""

    def recovered(self, what: str, count: int = 1) -> None:
        """Lost work was taken up again outside a sweep: ``what`` is ``redelivery`` (the
        broker gave a lost worker's phase to another worker)."""

    def turn_ended(self, outcome: str) -> None:
        """A turn ended outside its phase task's commit (its worker's watchdog; a cancel,
        in whichever process called ``cancel_turn``)."""

    def swept(self, counts: Mapping[str, int], recovered: int) -> None:
        """A recovery sweep ran: what it found and did (``SweepReport``), of which
        ``recovered`` items were lost or stuck work taken up again."""

    def ticked(self, fired: int, skipped: int) -> None:
        """Schedule ticks fired and skipped by one look."""

    def webhook_attempted(self, outcome: str) -> None:
        """A webhook delivery attempt ended: ``delivered``, ``retrying``, ``failed`` or
        ``stale``."""


class NullObserver:
    """Listens to nothing (the default)."""

    def lock_waited(self, seconds: float) -> None:
        """Ignored."""

    def commit_refused(self, what: str) -> None:
        """Ignored."""

    def recovered(self, what: str, count: int = 1) -> None:
        """Ignored."""

    def turn_ended(self, outcome: str) -> None:
        """Ignored."""

    def swept(self, counts: Mapping[str, int], recovered: int) -> None:
        """Ignored."""

    def ticked(self, fired: int, skipped: int) -> None:
        """Ignored."""

    def webhook_attempted(self, outcome: str) -> None:
        """Ignored."""


current: Observer = NullObserver()


def install(observer: Observer | None) -> None:
    """Make ``observer`` this process's listener (None: nobody listens)."""
    global current  # noqa: PLW0603 - one listener per process, read on every call
    current = observer if observer is not None else NullObserver()
