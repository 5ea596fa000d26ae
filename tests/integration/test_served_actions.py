"""The actions table: what each worker published when it started."""

from __future__ import annotations

from sqlalchemy import select

from state.storage.db import get_engine
from state.storage.tables import actions
from state.workflows.served import ServedActions


def test_publish_replaces_a_workers_own_rows_and_keeps_others(db_url: str) -> None:
    engine = get_engine(db_url)
    served = ServedActions(engine)
    with engine.begin() as conn:
        conn.execute(actions.delete())
    assert served.names() == set()
    served.publish("w1@a", {"reverse": "text_actions", "shout": "text_actions"})
    served.publish("w2@b", {"shout": "loud_actions", "count": "counting"})
    assert served.names() == {"reverse", "shout", "count"}
    with engine.connect() as conn:
        rows = {r.name: (r.module, r.worker) for r in conn.execute(select(actions))}
    assert rows["shout"] == ("loud_actions", "w2@b")  # the last publisher wins
    served.publish("w1@a", {"reverse": "text_actions"})  # w1 no longer has "shout": w2 does
    assert served.names() == {"reverse", "shout", "count"}
    served.publish("w2@b", {})
    assert served.names() == {"reverse"}
