"""One statement per phase on Postgres: the guarded session update, the new history rows
and the inbox changes travel as one SQL statement (data-modifying CTEs).

A middle phase commits in a single round trip, in autocommit mode. A phase that ends a
turn needs one more statement, in the same transaction: the check for queued messages
must run after the session row is locked and updated, so that a message committed
meanwhile is seen (a statement's own snapshot would miss it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import Engine

from state.documents import codec
from state.session import utcnow
from state.storage import prepared as pg_prepared

Document = dict[str, Any]

_UPDATE = """
UPDATE sessions SET revision = %(new_revision)s, phase = %(phase)s, status = %(status)s,
    doc = %(doc)s::jsonb, message_count = %(message_count)s, last_task_id = %(task_id)s,
    deadline_at = %(deadline_at)s, recoveries = 0, updated_at = %(now)s
WHERE session_id = %(session_id)s AND revision = %(revision)s
RETURNING session_id"""

_QUEUED = pg_prepared.prepare(
    "agentstate_has_queued",
    "SELECT EXISTS (SELECT 1 FROM inbox WHERE session_id = %(session_id)s AND state = 'queued')",
)


@lru_cache(maxsize=32)
def statement(messages: int, inbox_changes: int) -> pg_prepared.Prepared:
    """The commit statement for a phase adding ``messages`` rows and changing inbox rows.

    Only placeholder numbers are formatted into the SQL; every value is a bound parameter.
    """
    parts = [f"WITH s AS ({_UPDATE})"]
    if messages:
        rows = ", ".join(
            f"(%(seq{i})s::int, %(role{i})s::text, %(content{i})s::text, %(ts{i})s::text, "
            f"%(meta{i})s::jsonb)"
            for i in range(messages)
        )
        parts.append(
            ", m AS (INSERT INTO messages (session_id, seq, role, content, timestamp, metadata) "  # noqa: S608
            f"SELECT s.session_id, v.seq, v.role, v.content, v.ts, v.meta FROM s, "
            f"(VALUES {rows}) AS v(seq, role, content, ts, meta))"
        )
    parts.extend(
        f", i{i} AS (UPDATE inbox SET state = %(inbox_state{i})s "  # noqa: S608
        f"WHERE message_id = %(inbox_id{i})s AND EXISTS (SELECT 1 FROM s))"
        for i in range(inbox_changes)
    )
    parts.append(" SELECT count(*) FROM s")
    return pg_prepared.prepare(f"agentstate_commit_{messages}_{inbox_changes}", "".join(parts))


def parameters(
    session_id: str,
    revision: int,
    fields: Document,
    new_messages: list[Document],
    inbox_state: dict[str, str],
) -> Document:
    """The bound parameters of :func:`statement` (values only: never spliced into SQL)."""
    params: Document = {
        "session_id": session_id,
        "revision": revision,
        "new_revision": revision + 1,
        "now": utcnow(),
        **fields,
        "doc": codec.dumps(fields["doc"]),
    }
    first_seq = fields["message_count"] - len(new_messages)
    for i, item in enumerate(new_messages):
        params[f"seq{i}"] = first_seq + i
        params[f"role{i}"] = str(item.get("role", "user"))
        params[f"content{i}"] = str(item.get("content", ""))
        params[f"ts{i}"] = str(item.get("timestamp") or utcnow().isoformat())
        params[f"meta{i}"] = codec.dumps(item.get("metadata") or {})
    for i, (message_id, state) in enumerate(inbox_state.items()):
        params[f"inbox_id{i}"] = message_id
        params[f"inbox_state{i}"] = state
    return params


def commit(
    engine: Engine, autocommit: Engine, params: Document, shape: tuple[int, int], check_inbox: bool
) -> tuple[bool, bool]:
    """Run the commit; return (whether the guarded update applied, whether messages wait)."""
    prepared = statement(*shape)
    if not check_inbox:
        with autocommit.connect() as conn:
            return bool(pg_prepared.execute(conn, prepared, params).scalar_one()), False
    with engine.begin() as conn:
        applied = bool(pg_prepared.execute(conn, prepared, params).scalar_one())
        queued = applied and bool(pg_prepared.execute(conn, _QUEUED, params).scalar_one())
    return applied, queued
