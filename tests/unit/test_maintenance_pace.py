"""Maintenance pacing (issue #47): AGENTSTATE_MAINTENANCE_PACE reaches every batch of a
retention run or an erasure, and only within it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import Connection, create_engine, text

from config import Settings
from state.lifecycle import rows


def test_the_pace_holds_within_a_run_and_not_after(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'pace.db'}")
    seen: list[float] = []

    def work(conn: Connection) -> int:
        seen.append(rows._pace.get())
        return int(conn.execute(text("SELECT 1")).scalar_one())

    with rows.pacing(0.01):
        assert rows.in_batch(engine, work) == 1
        with rows.pacing(0.0):
            rows.in_batch(engine, work)
        rows.in_batch(engine, work)
    rows.in_batch(engine, work)
    assert seen == [0.01, 0.0, 0.01, 0.0]


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().maintenance_pace == 0.5
    monkeypatch.setenv("AGENTSTATE_MAINTENANCE_PACE", "0")
    assert Settings().maintenance_pace == 0.0
    monkeypatch.setenv("AGENTSTATE_MAINTENANCE_PACE", "-1")
    with pytest.raises(ValidationError):
        Settings()
