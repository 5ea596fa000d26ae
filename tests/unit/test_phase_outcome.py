"""A phase task's result (what Flower shows) is every field of its PhaseOutcome."""

from __future__ import annotations

import dataclasses
import json

from state.machine import Phase
from state.turns.draft import PhaseOutcome


def test_the_result_holds_every_field_and_is_json() -> None:
    outcome = PhaseOutcome("sess-1", "applied", [Phase.UNDERSTANDING, Phase.PLANNING], 7)
    result = outcome.as_dict()
    # Built by hand for speed: a field added to PhaseOutcome must be added there too.
    assert result == dataclasses.asdict(outcome)
    assert json.loads(json.dumps(result)) == {
        "session_id": "sess-1",
        "status": "applied",
        "phases": ["understanding", "planning"],
        "revision": 7,
        "turn": None,
        "error": None,
    }


def test_the_result_does_not_share_the_outcomes_list() -> None:
    outcome = PhaseOutcome("sess-1", "applied", [Phase.UNDERSTANDING])
    outcome.as_dict()["phases"].append(Phase.PLANNING)
    assert outcome.phases == [Phase.UNDERSTANDING]
