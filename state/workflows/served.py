"""The workflow actions the workers serve, as they published them when they started.

A sender (an app calling ``start_workflow``) need not import the app's action modules:
it validates a spec against its own registry together with these rows. Every worker
takes every step from one queue, so all workers are meant to serve the same actions; a
row only says that some worker served the action when it last started.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, delete, select

from state.clock import utcnow
from state.storage.db import dialect_insert, read_connection
from state.storage.tables import actions


class ServedActions:
    """The ``actions`` table: one row per action name."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def publish(self, worker: str, served: Mapping[str, str]) -> None:
        """Record that ``worker`` serves ``served`` (action name -> module), and forget
        the names this worker published before and serves no more."""
        now = utcnow()
        with self.engine.begin() as conn:
            if served:
                stmt = dialect_insert(conn, actions).values(
                    [
                        {"name": name, "module": module, "worker": worker, "updated_at": now}
                        for name, module in sorted(served.items())
                    ]
                )
                excluded = stmt.excluded
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[actions.c.name],
                        set_={
                            "module": excluded.module,
                            "worker": excluded.worker,
                            "updated_at": excluded.updated_at,
                        },
                    )
                )
            conn.execute(
                delete(actions).where(
                    actions.c.worker == worker, actions.c.name.not_in(list(served))
                )
            )

    def names(self) -> set[str]:
        """Every action some worker published."""
        with read_connection(self.engine) as conn:
            return set(conn.execute(select(actions.c.name)).scalars())
