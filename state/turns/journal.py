"""The journal of a framework agent's turn: its recorded steps (``agent_steps``).

A framework run inside a turn's ``executing`` phase makes several steps (model requests,
tool calls). Each is recorded here when it finishes, before the next begins; a run done
again (its worker died, the sweep resumed the turn) finds each finished step's result
here and does not do the step again. A step is known by its run (``run``: 0, then one
more after each person's decision), its name (the framework's name for the operation)
and its occurrence under that name in the run (``n``), so a run replays its steps
whatever order unrelated steps take.

Names starting with ``~`` are the turn's own notes: how a run ended waiting for people
(``ENDED``) and the decisions (``DECIDED``, one per ``n``). No framework import here:
payloads are JSON values the adapter made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Table, delete, select

from state.clock import utcnow
from state.documents import codec
from state.storage.db import dialect_insert, read_connection
from state.storage.tables import Base

ENDED = "~ended"  # a run's ending: it waits for people
DECIDED = "~decided"  # a decision on the ending's requests, n = 0, 1, ...
_steps: Table = Base.metadata.tables["agent_steps"]


@dataclass
class Journal:
    """The recorded steps of one turn, read once, written as the run goes."""

    engine: Engine
    session_id: str
    message_id: str
    rows: dict[tuple[int, str, int], Any] = field(default_factory=dict)
    replayed: int = 0  # steps answered from the journal in this process
    recorded: int = 0  # steps done and recorded in this process
    pruned: bool = False  # earlier turns' steps deleted (with this process's first record)

    @classmethod
    def load(cls, engine: Engine, session_id: str, message_id: str) -> Journal:
        """The journal of the turn answering ``message_id``, as stored."""
        with read_connection(engine) as conn:
            found = conn.execute(
                select(_steps.c.run, _steps.c.name, _steps.c.n, _steps.c.payload).where(
                    _steps.c.session_id == session_id, _steps.c.message_id == message_id
                )
            ).all()
        rows = {(int(r.run), str(r.name), int(r.n)): codec.loads(r.payload) for r in found}
        return cls(engine, session_id, message_id, rows)

    def get(self, run: int, name: str, n: int) -> tuple[bool, Any]:
        """``(True, payload)`` if the step is recorded, else ``(False, None)``."""
        key = (run, name[:255], n)
        return (True, self.rows[key]) if key in self.rows else (False, None)

    def put(self, run: int, name: str, n: int, payload: Any) -> Any:
        """Record the step; returns the recorded payload (another process's, if one
        recorded the same step first: the first record wins)."""
        name = name[:255]
        text = codec.require_storable(payload, f"step {name}")
        where = (
            _steps.c.session_id == self.session_id,
            _steps.c.message_id == self.message_id,
            _steps.c.run == run,
            _steps.c.name == name,
            _steps.c.n == n,
        )
        with self.engine.begin() as conn:
            if not self.pruned:
                # A session runs one turn at a time, and a finished turn's steps are never
                # read again: the table holds one turn's steps per session, however long
                # the conversation (deleted in the transaction of the first record).
                conn.execute(
                    delete(_steps).where(
                        _steps.c.session_id == self.session_id,
                        _steps.c.message_id != self.message_id,
                    )
                )
            stored = conn.execute(
                dialect_insert(conn, _steps)
                .values(
                    session_id=self.session_id,
                    message_id=self.message_id,
                    run=run,
                    name=name,
                    n=n,
                    payload=text,
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing()
                .returning(_steps.c.payload)
            ).scalar()
            if stored is None:  # recorded first by another process
                stored = conn.execute(select(_steps.c.payload).where(*where)).scalar_one()
        self.pruned = True
        self.rows[(run, name, n)] = codec.loads(stored)
        return self.rows[(run, name, n)]

    def decisions(self, run: int) -> list[Any]:
        """The decisions recorded on ``run``'s ending, in order."""
        found: list[Any] = []
        while (run, DECIDED, len(found)) in self.rows:
            found.append(self.rows[(run, DECIDED, len(found))])
        return found

    def decided(self, approval_id: str) -> bool:
        """Whether a decision on ``approval_id`` is recorded (in any run)."""
        return any(
            name == DECIDED and isinstance(p, dict) and p.get("approval_id") == approval_id
            for (_run, name, _n), p in self.rows.items()
        )
