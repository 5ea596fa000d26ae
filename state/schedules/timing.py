"""When a schedule's ticks fall: a five-field cron expression in an IANA timezone, or an
interval. Pure functions of the expression and a clock reading (no I/O).

croniter reads the expression and walks the local wall clock (naive times); the wall times it
gives are placed on the UTC line here, with ``zoneinfo``, by the DST rule of agentstate:

- a wall time the clocks skip (spring forward) fires once, at the first minute that exists
  after it (02:30 on a night that goes from 02:00 to 03:00 fires at 03:00; every skipped time
  of the night lands on that same minute, so it fires once);
- a wall time the clocks repeat (fall back) fires once, at its first occurrence.

Ticks are compared as UTC instants: a wall time whose instant is not after the tick before
it has already fired (or landed on one that did).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

from state.errors import ScheduleSpecError

CRON_FIELDS = 5
MAX_CRON_CHARS = 255
MAX_TIMEZONE_CHARS = 64
# The longest gap a zone's clocks ever jump over, in minutes (a day: Samoa, 2011).
_MAX_GAP_MINUTES = 24 * 60
# Wall times walked before giving up on finding one after a given instant (a fall-back
# night under an every-minute cron repeats 60; an expression that never matches raises).
_MAX_STEPS = 10_000
MAX_EVERY_SECONDS = 366 * 86400.0


def zone(name: object) -> ZoneInfo:
    """The IANA timezone ``name``, or ScheduleSpecError."""
    if not isinstance(name, str) or not name or len(name) > MAX_TIMEZONE_CHARS:
        raise ScheduleSpecError(
            f"timezone must be an IANA name such as 'Europe/Paris' (got {name!r})"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleSpecError(
            f"unknown timezone {name!r}: use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from None


@dataclass(frozen=True)
class Timing:
    """A schedule's clock: ``cron`` in ``timezone``, or every ``every_seconds``."""

    cron: str | None
    every_seconds: float | None
    timezone: str = "UTC"

    @classmethod
    def checked(cls, cron: object, every_seconds: object, timezone: object) -> Timing:
        """The timing these arguments describe, or ScheduleSpecError saying what is wrong."""
        tz = zone(timezone)
        if (cron is None) == (every_seconds is None):
            raise ScheduleSpecError("give exactly one of cron and every_seconds")
        if cron is not None:
            timing = cls(_checked_cron(cron), None, tz.key)
            timing.next_after(datetime.now(UTC))  # an expression that never fires says so
            return timing
        return cls(None, _checked_interval(every_seconds), tz.key)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (timezone-aware), in UTC."""
        moment = moment.astimezone(UTC)
        if self.every_seconds is not None:
            return _next_interval(self.every_seconds, moment)
        assert self.cron is not None
        tz = ZoneInfo(self.timezone)
        walk = croniter(self.cron, moment.astimezone(tz).replace(tzinfo=None, fold=0))
        try:
            for _ in range(_MAX_STEPS):
                instant = place(walk.get_next(datetime), tz)
                if instant > moment:
                    return instant
        except CroniterBadDateError:
            pass
        raise ScheduleSpecError(f"cron {self.cron!r} has no time after {moment.isoformat()}")

    def latest_due(self, first_due: datetime, now: datetime) -> datetime:
        """The last tick at or before ``now``, starting from ``first_due`` (itself a tick
        at or before ``now``): what catching up after an outage fires."""
        if self.every_seconds is not None:
            behind = math.floor((now - first_due).total_seconds() / self.every_seconds)
            return first_due + timedelta(seconds=max(0, behind) * self.every_seconds)
        latest = first_due
        for _ in range(_MAX_STEPS):
            following = self.next_after(latest)
            if following > now:
                return latest
            latest = following
        # Far behind (a long outage on a frequent cron): the tick before now, found backwards.
        return max(first_due, self._previous(now))

    def _previous(self, now: datetime) -> datetime:
        assert self.cron is not None
        tz = ZoneInfo(self.timezone)
        # A second past now: a tick exactly at now is due (the walk back is strict).
        later = now + timedelta(seconds=1)
        walk = croniter(self.cron, later.astimezone(tz).replace(tzinfo=None, fold=0))
        for _ in range(_MAX_STEPS):
            instant = place(walk.get_prev(datetime), tz)
            if instant <= now:
                return instant
        return now


def place(wall: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant at which naive wall time ``wall`` in ``tz`` fires: its first
    occurrence if the clocks repeat it, the first minute that exists after it if they skip
    it."""
    if _exists(wall, tz):
        return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    minute = wall.replace(second=0, microsecond=0)
    for step in range(1, _MAX_GAP_MINUTES + 1):
        later = minute + timedelta(minutes=step)
        if _exists(later, tz):
            return later.replace(tzinfo=tz, fold=0).astimezone(UTC)
    raise ScheduleSpecError(f"no valid time after {wall.isoformat()} in {tz.key}")


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    """Whether the clocks of ``tz`` show ``wall`` at some instant (a skipped time does not
    survive the way to UTC and back)."""
    there_and_back = wall.replace(tzinfo=tz, fold=0).astimezone(UTC).astimezone(tz)
    return there_and_back.replace(tzinfo=None) == wall


def _checked_cron(cron: object) -> str:
    if not isinstance(cron, str) or len(cron) > MAX_CRON_CHARS:
        raise ScheduleSpecError(f"cron must be a string of at most {MAX_CRON_CHARS} characters")
    fields = cron.split()
    if len(fields) != CRON_FIELDS:
        raise ScheduleSpecError(
            f"cron must have five fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}: {cron!r}"
        )
    normal = " ".join(fields)
    try:
        valid = croniter.is_valid(normal)
    except CroniterError:
        valid = False
    if not valid:
        raise ScheduleSpecError(f"not a valid cron expression: {cron!r}")
    return normal


def _checked_interval(every_seconds: object) -> float:
    if isinstance(every_seconds, bool) or not isinstance(every_seconds, int | float):
        raise ScheduleSpecError("every_seconds must be a number of seconds")
    value = float(every_seconds)
    if not math.isfinite(value) or value < 1 or value > MAX_EVERY_SECONDS:
        raise ScheduleSpecError(
            f"every_seconds must be at least 1 and at most {MAX_EVERY_SECONDS:g} (a year)"
        )
    return value


def _next_interval(every_seconds: float, moment: datetime) -> datetime:
    """The next multiple of the interval since the Unix epoch after ``moment``: ticks fall
    on the same instants whoever computes them, whenever."""
    seconds = moment.timestamp()
    count = math.floor(seconds / every_seconds) + 1
    return datetime.fromtimestamp(count * every_seconds, UTC)


def tick_text(tick: datetime) -> str:
    """A tick as ISO 8601 in UTC (``2026-12-04T09:00:00Z``), the form in workflow ids."""
    moment = tick.astimezone(UTC)
    shown = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        shown += f".{moment.microsecond:06d}"
    return shown + "Z"
