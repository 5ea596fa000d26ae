"""When ticks fall, with a fixed clock: cron in a timezone across both DST transitions (a
skipped local time fires once at the next valid minute, a repeated one once), intervals,
catching up, and expressions refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from state.errors import BadInputError
from state.schedules.timing import Timing, place, tick_text

NEW_YORK = ZoneInfo("America/New_York")


def ticks(timing: Timing, start: datetime, count: int) -> list[str]:
    found, moment = [], start
    for _ in range(count):
        moment = timing.next_after(moment)
        found.append(moment.astimezone(NEW_YORK).strftime("%m-%d %H:%M%z"))
    return found


def test_a_skipped_local_time_fires_once_at_the_next_valid_minute() -> None:
    # 2026-03-08 in New York: 02:00 EST becomes 03:00 EDT.
    daily = Timing.checked("30 2 * * *", None, "America/New_York")
    assert ticks(daily, datetime(2026, 3, 7, 12, tzinfo=UTC), 3) == [
        "03-08 03:00-0400",
        "03-09 02:30-0400",
        "03-10 02:30-0400",
    ]
    # Every skipped time of the night lands on 03:00, which fires once.
    often = Timing.checked("*/20 * * * *", None, "America/New_York")
    assert ticks(often, datetime(2026, 3, 8, 6, 30, tzinfo=UTC), 4) == [
        "03-08 01:40-0500",
        "03-08 03:00-0400",
        "03-08 03:20-0400",
        "03-08 03:40-0400",
    ]


def test_a_repeated_local_time_fires_once() -> None:
    # 2026-11-01 in New York: 02:00 EDT becomes 01:00 EST; 01:xx happens twice.
    often = Timing.checked("*/20 * * * *", None, "America/New_York")
    assert ticks(often, datetime(2026, 11, 1, 4, 50, tzinfo=UTC), 5) == [
        "11-01 01:00-0400",
        "11-01 01:20-0400",
        "11-01 01:40-0400",
        "11-01 02:00-0500",
        "11-01 02:20-0500",
    ]
    daily = Timing.checked("30 1 * * *", None, "America/New_York")
    assert ticks(daily, datetime(2026, 10, 31, 12, tzinfo=UTC), 2) == [
        "11-01 01:30-0400",
        "11-02 01:30-0500",
    ]
    # Asked during the second 01:xx, the next tick is the next new wall time.
    assert ticks(often, datetime(2026, 11, 1, 6, 10, tzinfo=UTC), 1) == ["11-01 02:00-0500"]


def test_place_puts_wall_times_on_the_utc_line() -> None:
    assert place(datetime(2026, 3, 8, 2, 30), NEW_YORK) == datetime(2026, 3, 8, 7, tzinfo=UTC)
    assert place(datetime(2026, 11, 1, 1, 30), NEW_YORK) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    assert place(datetime(2026, 6, 1, 9), NEW_YORK) == datetime(2026, 6, 1, 13, tzinfo=UTC)


def test_intervals_fall_on_multiples_since_the_epoch() -> None:
    every = Timing.checked(None, 15, "UTC")
    start = datetime(2026, 12, 4, 9, 0, 7, tzinfo=UTC)
    assert every.next_after(start) == datetime(2026, 12, 4, 9, 0, 15, tzinfo=UTC)
    assert every.next_after(every.next_after(start)) == datetime(2026, 12, 4, 9, 0, 30, tzinfo=UTC)
    assert tick_text(datetime(2026, 12, 4, 9, 0, 30, tzinfo=UTC)) == "2026-12-04T09:00:30Z"


def test_catching_up_finds_the_latest_tick_due() -> None:
    hourly = Timing.checked("0 * * * *", None, "UTC")
    first = datetime(2026, 12, 1, 0, tzinfo=UTC)
    now = datetime(2026, 12, 4, 9, 59, tzinfo=UTC)
    assert hourly.latest_due(first, now) == datetime(2026, 12, 4, 9, tzinfo=UTC)
    minutely = Timing.checked("* * * * *", None, "UTC")  # far behind: found backwards
    a_year = first - timedelta(days=365)
    assert minutely.latest_due(a_year, now) == datetime(2026, 12, 4, 9, 59, tzinfo=UTC)
    every = Timing.checked(None, 7, "UTC")
    assert every.latest_due(datetime(2026, 12, 4, tzinfo=UTC), now) <= now


@pytest.mark.parametrize(
    ("cron", "every", "zone", "says"),
    [
        ("61 * * * *", None, "UTC", "not a valid cron"),
        ("0 9 * *", None, "UTC", "five fields"),
        ("0 0 0 9 * *", None, "UTC", "five fields"),
        ("0 0 31 2 *", None, "UTC", "no time after"),
        ("0 9 * * *", None, "Europe/Atlantis", "unknown timezone"),
        ("0 9 * * *", None, "", "IANA"),
        (None, 0, "UTC", "at least 1"),
        (None, True, "UTC", "number"),
        (None, None, "UTC", "exactly one"),
        ("0 9 * * *", 60, "UTC", "exactly one"),
    ],
)
def test_bad_timing_is_refused(cron: str | None, every: object, zone: str, says: str) -> None:
    with pytest.raises(BadInputError, match=says):
        Timing.checked(cron, every, zone)
