"""What the CLI draws: rows cut to a terminal's width, and a progress line that agrees
with itself."""

from __future__ import annotations

import pytest

from state.workflows.records import WorkflowProgress
from tasks.cli.progress import progress_line
from tasks.cli.terminal import ELLIPSIS, fit


@pytest.mark.parametrize(
    ("line", "columns", "expected"),
    [
        ("short", 10, "short"),
        ("exactly-10", 10, "exactly-10"),
        ("eleven-long", 10, "eleven-lo" + ELLIPSIS),
        ("日本語のセッション", 10, "日本語の" + ELLIPSIS),  # two columns each
    ],
)
def test_fit_cuts_at_the_width_with_an_ellipsis(line: str, columns: int, expected: str) -> None:
    assert fit(line, columns) == expected


def _progress(status: str, total: int, remaining: int, **counts: int) -> WorkflowProgress:
    return WorkflowProgress("wf", status, total, remaining, counts.get("failed", 0), counts)


def test_a_finished_bar_never_shows_steps_still_running() -> None:
    # The counts by status are read apart from the done count: they may lag behind it.
    line = progress_line(_progress("success", 3, 0, success=2, running=1))
    assert line.endswith("3/3 done")
    failed = progress_line(_progress("failed", 3, 0, success=1, failed=1, skipped=1, retrying=1))
    assert failed.endswith("3/3 done, 1 failed, 1 skipped")


def test_a_running_bar_shows_no_more_running_than_are_left() -> None:
    line = progress_line(_progress("running", 4, 1, success=3, running=2, retrying=1))
    assert line.endswith("3/4 done, 1 running")
    assert progress_line(_progress("running", 4, 3, success=1, running=2)).endswith(
        "1/4 done, 2 running"
    )
