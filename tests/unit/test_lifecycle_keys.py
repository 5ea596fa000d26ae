"""Which Redis keys name a session, a user or a workflow (what erasure deletes), and the
retention settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config import Settings
from state.storage import keys


def test_every_key_of_a_session_and_a_user_is_owned_and_says_whose_it_is() -> None:
    owned = keys.owned(session_ids=["s-1"], user_id="u-1", workflow_ids=["w-1"])
    assert set(owned) == {
        keys.session_lock("s-1"),
        keys.session_cache("s-1"),
        keys.session_stream("s-1"),
        keys.session_chunks("s-1"),
        keys.user_state_cache("u-1"),
    }
    assert {keys.owner_of(k) for k in owned} == {("session", "s-1"), ("user", "u-1")}
    assert keys.owner_of(keys.workflow_events("w-1")) == ("workflow", "w-1")
    for unowned in (keys.sweep_lock(), keys.baseline_counter("x"), "other:{s-1}", "agentstate"):
        assert keys.owner_of(unowned) is None


def test_retention_of_sessions_and_workflows_is_off_unless_set() -> None:
    assert Settings().sessions_retain_days is None
    assert Settings().workflows_retain_days is None
    assert Settings(sessions_retain_days="").sessions_retain_days is None  # type: ignore[arg-type]
    assert Settings(workflows_retain_days=0.25).workflows_retain_days == 0.25
    with pytest.raises(ValidationError):
        Settings(sessions_retain_days=0)
    for name in ("sessions_retain_days", "workflows_retain_days"):
        assert Settings.model_fields[name].description
