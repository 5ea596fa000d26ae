"""How much ready work waits in the database for its user's fair share.

The fair-share scheduler (AGENTSTATE_USER_STEP_CONCURRENCY) fills this in; until then
nothing waits there and the gauge reads 0. The metrics endpoint calls it at scrape time,
never on a phase's path.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine


def steps_waiting(engine: Engine) -> int:
    """Ready workflow steps held back in the database until their user's running steps
    finish (``agentstate_steps_waiting_fair_share``)."""
    del engine  # nothing is held back yet
    return 0
