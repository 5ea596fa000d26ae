"""What the engines need from a task queue; ``tasks`` implements it with Celery."""

from __future__ import annotations

from typing import Protocol


class Dispatcher(Protocol):
    """Enqueues work. Every message carries the revision it expects, so duplicates are
    harmless and a dispatch may safely be repeated."""

    def phase(
        self, phase: str, session_id: str, revision: int | None, carried: str | None = None
    ) -> None:
        """Run ``phase`` of the session at ``revision`` (None: start a turn if idle).

        ``carried``: the snapshot at ``revision`` in its cache form (JSON), which the
        phase may continue from instead of reading it (its commit checks it)."""

    def timeout(self, session_id: str, deadline: float, delay_s: float) -> None:
        """Check the session's execution deadline after ``delay_s`` seconds."""

    def step(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        delay_s: float = 0.0,
        carried: str | None = None,
    ) -> None:
        """Run a workflow step at ``revision`` after ``delay_s`` seconds.

        ``carried``: the step as a peek reads it (JSON), which a quick action may run
        from instead of reading it (its commit checks it)."""

    def backlog(self) -> int | None:
        """How many messages wait in the queue (None if the broker cannot tell)."""

    def oldest_queued(self, steps: bool = False) -> float | None:
        """When the oldest of our messages still waiting in the turns' queue (or the
        steps', if ``steps``) was sent (epoch seconds); None if none waits or the broker
        cannot tell. Anything sent after it is still queued: the sweep leaves it be."""


class RecordingDispatcher:
    """Collects dispatches instead of sending them (pure-logic tests, dry runs)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[object, ...]]] = []
        # What each dispatch carried: by (phase, session_id, revision) for a phase's
        # snapshot, by ("step", "workflow_id/step_id", revision) for a step.
        self.carried: dict[tuple[str, str, int | None], str] = {}

    def phase(
        self, phase: str, session_id: str, revision: int | None, carried: str | None = None
    ) -> None:
        self.sent.append(("phase", (phase, session_id, revision)))
        if carried is not None:
            self.carried[(str(phase), session_id, revision)] = carried

    def timeout(self, session_id: str, deadline: float, delay_s: float) -> None:
        self.sent.append(("timeout", (session_id, deadline, delay_s)))

    def step(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        delay_s: float = 0.0,
        carried: str | None = None,
    ) -> None:
        self.sent.append(("step", (workflow_id, step_id, revision, delay_s)))
        if carried is not None:
            self.carried[("step", f"{workflow_id}/{step_id}", revision)] = carried

    def backlog(self) -> int | None:
        return len(self.sent)

    def oldest_queued(self, steps: bool = False) -> float | None:
        return None
