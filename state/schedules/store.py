"""Schedules in the database: create, read, list, pause, resume, delete, and the log of
their ticks. Every call that names a schedule takes ``user_id``: given, another user's
schedule reads and acts exactly as an unknown one (NotFoundError, nothing changed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from state.clock import as_utc, iso, utcnow
from state.documents import codec
from state.documents.codec import Document
from state.errors import IdempotencyConflictError, NotFoundError, SessionOwnershipError
from state.paging import whole_number
from state.quota import reserve_one
from state.schedules.spec import RunStatus, ScheduleSpec
from state.schedules.timing import Timing, tick_text
from state.storage.db import read_connection
from state.storage.tables import sessions
from state.storage.tables_automation import schedule_runs, schedules

QUOTA_SETTING = "AGENTSTATE_MAX_SCHEDULES_PER_USER"
MAX_RUNS_PAGE = 1000


def unknown(schedule_id: str) -> NotFoundError:
    """What another user's schedule, or one that does not exist, raises."""
    return NotFoundError(f"unknown schedule {schedule_id!r}")


class ScheduleStore:
    """The ``schedules`` and ``schedule_runs`` tables (see the module docstring)."""

    def __init__(self, engine: Engine, max_per_user: int | None = None) -> None:
        self.engine = engine
        self.max_per_user = max_per_user

    def create(self, spec: ScheduleSpec, now: datetime | None = None) -> Document:
        """Store ``spec`` (its first tick the first one after ``now``); the same call again
        returns the stored schedule, another schedule under the same id is refused."""
        now = now or utcnow()
        values = _values(spec, now)
        try:
            with self.engine.begin() as conn:
                _check_session(conn, spec)
                if self.max_per_user is not None:
                    reserve_one(conn, schedules, spec.user_id, self.max_per_user, QUOTA_SETTING)
                conn.execute(insert(schedules).values(values))
        except IntegrityError:
            found = self.get(spec.schedule_id, spec.user_id)
            if found is not None and _same(found, spec):
                return found
            raise IdempotencyConflictError(
                f"schedule {spec.schedule_id!r} already exists; use another schedule_id"
            ) from None
        return as_document(values)

    def get(self, schedule_id: str, user_id: str | None = None) -> Document | None:
        """The schedule, or None (unknown, or not ``user_id``'s)."""
        with read_connection(self.engine) as conn:
            row = conn.execute(_mine(select(schedules), schedule_id, user_id)).first()
        return None if row is None else as_document(row._mapping)

    def listing(self, user_id: str | None = None) -> list[Document]:
        """Every schedule (of ``user_id``, if given), by id."""
        query = select(schedules).order_by(schedules.c.schedule_id)
        if user_id is not None:
            query = query.where(schedules.c.user_id == user_id)
        with read_connection(self.engine) as conn:
            return [as_document(row._mapping) for row in conn.execute(query)]

    def pause(self, schedule_id: str, user_id: str | None = None) -> Document:
        """Stop firing (a tick being fired now still lands)."""
        return self._set(schedule_id, user_id, {"paused": True})

    def resume(
        self, schedule_id: str, user_id: str | None = None, now: datetime | None = None
    ) -> Document:
        """Fire again from the first tick after now (the paused time is not caught up)."""
        found = self.get(schedule_id, user_id)
        if found is None:
            raise unknown(schedule_id)
        timing = Timing(found["cron"], found["every_seconds"], found["timezone"])
        next_tick = timing.next_after(now or utcnow())
        return self._set(schedule_id, user_id, {"paused": False, "next_tick": next_tick})

    def delete(self, schedule_id: str, user_id: str | None = None) -> bool:
        """Delete the schedule and its log (NotFoundError if there is none)."""
        with self.engine.begin() as conn:
            gone = conn.execute(_mine(delete(schedules), schedule_id, user_id)).rowcount
            if not gone:
                raise unknown(schedule_id)
            conn.execute(delete(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id))
        return True

    def runs(self, schedule_id: str, user_id: str | None = None, limit: int = 50) -> list[Document]:
        """The schedule's ticks, newest first: ``{"tick", "status", "message_id" |
        "workflow_id"}`` (a skipped one says why in ``reason``)."""
        limit = whole_number(limit, "limit", low=1, high=MAX_RUNS_PAGE)
        if self.get(schedule_id, user_id) is None:
            raise unknown(schedule_id)
        query = (
            select(schedule_runs)
            .where(schedule_runs.c.schedule_id == schedule_id)
            .order_by(schedule_runs.c.tick.desc())
            .limit(limit)
        )
        with read_connection(self.engine) as conn:
            return [run_document(row._mapping) for row in conn.execute(query)]

    def _set(self, schedule_id: str, user_id: str | None, values: dict[str, Any]) -> Document:
        statement = _mine(update(schedules), schedule_id, user_id).values(
            **values, updated_at=utcnow()
        )
        with self.engine.begin() as conn:
            row = conn.execute(statement.returning(*schedules.c)).first()
        if row is None:
            raise unknown(schedule_id)
        return as_document(row._mapping)


def _mine(statement: Any, schedule_id: str, user_id: str | None) -> Any:
    statement = statement.where(schedules.c.schedule_id == schedule_id)
    if user_id is not None:
        statement = statement.where(schedules.c.user_id == user_id)
    return statement


def _check_session(conn: Connection, spec: ScheduleSpec) -> None:
    """A schedule may write only to its user's session (or one that does not exist yet,
    which its first message creates for that user)."""
    if spec.session_id is None:
        return
    owner = conn.execute(
        select(sessions.c.user_id).where(sessions.c.session_id == spec.session_id)
    ).scalar()
    if owner is not None and owner != spec.user_id:
        raise SessionOwnershipError(f"unknown session {spec.session_id!r}")


def _values(spec: ScheduleSpec, now: datetime) -> dict[str, Any]:
    return {
        "schedule_id": spec.schedule_id,
        "user_id": spec.user_id,
        "cron": spec.timing.cron,
        "every_seconds": spec.timing.every_seconds,
        "timezone": spec.timing.timezone,
        "target_session_id": spec.session_id,
        "text": spec.text,
        "workflow": None if spec.workflow is None else codec.dumps(spec.workflow),
        "payload": codec.dumps(spec.payload),
        "catch_up": spec.catch_up.value,
        "overlap": spec.overlap.value,
        "paused": False,
        "next_tick": spec.timing.next_after(now),
        "last_tick": None,
        "created_at": now,
        "updated_at": now,
    }


def _same(found: Document, spec: ScheduleSpec) -> bool:
    mine = as_document(_values(spec, utcnow()))
    fields = ("user_id", "cron", "every_seconds", "timezone", "session_id", "text", "workflow")
    return all(found[k] == mine[k] for k in (*fields, "payload", "catch_up", "overlap"))


def _json(value: Any) -> Any:
    return codec.loads(value) if isinstance(value, str) else value


def as_document(row: Any) -> Document:
    """A ``schedules`` row as the client returns it."""
    paused = bool(row["paused"])
    next_tick = row["next_tick"]
    return {
        "schedule_id": row["schedule_id"],
        "user_id": row["user_id"],
        "cron": row["cron"],
        "every_seconds": row["every_seconds"],
        "timezone": row["timezone"],
        "session_id": row["target_session_id"],
        "text": row["text"],
        "workflow": None if row["workflow"] is None else _json(row["workflow"]),
        "payload": _json(row["payload"]),
        "catch_up": row["catch_up"],
        "overlap": row["overlap"],
        "paused": paused,
        "next_tick": None if paused or next_tick is None else tick_text(as_utc(next_tick)),
        "last_tick": None if row["last_tick"] is None else tick_text(as_utc(row["last_tick"])),
        "created_at": iso(row["created_at"]),
    }


def run_document(row: Any) -> Document:
    """A ``schedule_runs`` row as ``schedule_runs()`` returns it."""
    doc: Document = {"tick": tick_text(as_utc(row["tick"])), "status": row["status"]}
    if row["run_workflow_id"] is not None:
        doc["workflow_id"] = row["run_workflow_id"]
    else:
        doc["message_id"] = row["message_id"]
    if row["status"] == RunStatus.SKIPPED:
        doc["reason"] = row["reason"]
    doc["fired_at"] = iso(row["fired_at"])
    return doc
