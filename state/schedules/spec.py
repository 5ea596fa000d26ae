"""What a schedule is: its timing, what each tick does, its policies; checked whole before
anything is stored."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from state.documents import codec
from state.documents.codec import Document, require_object
from state.errors import ScheduleSpecError
from state.ids import validate_id
from state.schedules.timing import Timing

MAX_PAYLOAD_BYTES = 16384


class CatchUp(StrEnum):
    """What a schedule does with ticks missed while nothing fired them (beat down)."""

    LATEST = "latest"  # the most recent missed tick fires once
    NONE = "none"  # missed ticks are let go


class Overlap(StrEnum):
    """What a tick does while the run of the tick before is still going."""

    SKIP = "skip"  # recorded as skipped
    ENQUEUE = "enqueue"  # fires anyway (a message waits its turn; a workflow runs beside)


class RunStatus(StrEnum):
    """What became of one tick."""

    FIRED = "fired"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule, checked: exactly one timing and exactly one thing a tick does."""

    schedule_id: str
    user_id: str
    timing: Timing
    session_id: str | None
    text: str | None
    workflow: Document | None
    catch_up: CatchUp
    overlap: Overlap
    payload: Document

    @classmethod
    def checked(cls, schedule_id: str, arguments: dict[str, Any]) -> ScheduleSpec:
        """``create_schedule``'s arguments, checked (ScheduleSpecError and kin; the
        workflow spec itself is checked by the caller, who knows the actions)."""
        validate_id(schedule_id, "schedule")
        user_id = arguments["user_id"]
        validate_id(user_id, "user")
        timing = Timing.checked(
            arguments.get("cron"), arguments.get("every_seconds"), arguments.get("timezone", "UTC")
        )
        session_id, text, workflow = _target(arguments)
        payload = require_object(arguments.get("payload") or {}, "schedule payload")
        if len(codec.dumps(payload).encode()) > MAX_PAYLOAD_BYTES:
            raise ScheduleSpecError(f"schedule payload is over {MAX_PAYLOAD_BYTES} bytes")
        return cls(
            schedule_id,
            user_id,
            timing,
            session_id,
            text,
            workflow,
            _policy(CatchUp, arguments.get("catch_up", CatchUp.LATEST), "catch_up"),
            _policy(Overlap, arguments.get("overlap", Overlap.SKIP), "overlap"),
            payload,
        )


def _target(arguments: dict[str, Any]) -> tuple[str | None, str | None, Document | None]:
    session_id, text, workflow = (arguments.get(k) for k in ("session_id", "text", "workflow"))
    if (text is None) == (workflow is None):
        raise ScheduleSpecError(
            "give exactly one of text (a message to session_id) and workflow (a spec per tick)"
        )
    if session_id is not None:
        validate_id(session_id, "session")
    if text is not None:
        if session_id is None:
            raise ScheduleSpecError("a schedule with text needs the session_id it writes to")
        return session_id, text, None
    spec = dict(require_object(workflow, "schedule workflow"))
    if "workflow_id" in spec:
        raise ScheduleSpecError(
            "leave workflow_id out of a schedule's workflow: each tick's is {schedule_id}:{tick}"
        )
    if session_id is not None and spec.setdefault("session_id", session_id) != session_id:
        raise ScheduleSpecError("session_id and the workflow's session_id differ")
    return spec.get("session_id"), None, spec


def _policy(kind: type[CatchUp] | type[Overlap], value: object, name: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        allowed = " or ".join(repr(v.value) for v in kind)
        raise ScheduleSpecError(f"{name} must be {allowed} (got {value!r})") from None
