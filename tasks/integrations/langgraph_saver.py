"""LangGraph checkpoints in agentstate's database: a ``BaseCheckpointSaver`` of ours.

One LangGraph thread per session (``thread_id`` = the session id). Rows live in
``lg_checkpoints`` and ``lg_writes`` (migration 0024), erased and pruned with their session
(their ``session_id`` column). A checkpoint is stored whole, as LangGraph's own serializer
writes it; each row also names the turn (``message_id``) whose run wrote it, which is how a
turn run again after its worker died knows that the last checkpoint is its own.

A graph runs with durability "sync": a step's checkpoint is committed before the next
step starts, so a killed worker re-runs at most the step it was in.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from sqlalchemy import Engine, Table, and_, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from state.errors import StaleStateError
from state.sessions.snapshot import InboxState
from state.storage.tables import Base, inbox
from state.storage.tables_checkpoints import CheckpointRow, CheckpointWriteRow

checkpoints: Table = Base.metadata.tables[CheckpointRow.__tablename__]
writes: Table = Base.metadata.tables[CheckpointWriteRow.__tablename__]


class AgentstateSaver(BaseCheckpointSaver[int]):
    """Checkpoints of sessions' graphs in agentstate's database (sync API only: graphs run
    inside Celery tasks, which are sync).

    Args:
        engine: agentstate's database.
        message_id: the turn this saver writes for (recorded on each checkpoint).
    """

    def __init__(self, engine: Engine, message_id: str | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.message_id = message_id

    # -- reads -----------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest."""
        found = self._rows(config, None, None, limit=1)
        return next(iter(found), None)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The thread's checkpoints, newest first."""
        yield from self._rows(config, filter, before, limit=limit, latest_only=False)

    def latest_turn(self, session_id: str) -> str | None:
        """The turn (message id) that wrote the session's latest checkpoint."""
        query = (
            select(checkpoints.c.message_id)
            .where(checkpoints.c.session_id == session_id, checkpoints.c.checkpoint_ns == "")
            .order_by(checkpoints.c.checkpoint_id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else row[0]

    def _rows(
        self,
        config: RunnableConfig | None,
        filter_: dict[str, Any] | None,
        before: RunnableConfig | None,
        *,
        limit: int | None,
        latest_only: bool = True,
    ) -> builtins.list[CheckpointTuple]:
        configurable = (config or {}).get("configurable", {})
        query = select(checkpoints).order_by(checkpoints.c.checkpoint_id.desc())
        if "thread_id" in configurable:
            query = query.where(checkpoints.c.session_id == str(configurable["thread_id"]))
        if config is not None and "checkpoint_ns" in configurable:
            query = query.where(checkpoints.c.checkpoint_ns == configurable["checkpoint_ns"])
        elif latest_only:
            query = query.where(checkpoints.c.checkpoint_ns == "")
        wanted = get_checkpoint_id(config) if config is not None and latest_only else None
        if wanted:
            query = query.where(checkpoints.c.checkpoint_id == wanted)
        if before is not None and (before_id := get_checkpoint_id(before)):
            query = query.where(checkpoints.c.checkpoint_id < before_id)
        if limit is not None and not filter_:
            query = query.limit(limit)
        found: builtins.list[CheckpointTuple] = []
        with self.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                metadata = json.loads(row["metadata"])
                if filter_ and any(metadata.get(k) != v for k, v in filter_.items()):
                    continue
                found.append(self._tuple(conn, row, metadata))
                if limit is not None and len(found) >= limit:
                    break
        return found

    def _tuple(self, conn: Any, row: Any, metadata: Any) -> CheckpointTuple:
        session_id, ns, checkpoint_id = (
            row["session_id"],
            row["checkpoint_ns"],
            row["checkpoint_id"],
        )
        pending = conn.execute(
            select(writes.c.task_id, writes.c.channel, writes.c.type, writes.c.blob)
            .where(
                writes.c.session_id == session_id,
                writes.c.checkpoint_ns == ns,
                writes.c.checkpoint_id == checkpoint_id,
            )
            .order_by(writes.c.task_path, writes.c.task_id, writes.c.idx)
        ).all()
        parent = row["parent_checkpoint_id"]
        return CheckpointTuple(
            config=_config(session_id, ns, checkpoint_id),
            checkpoint=self.serde.loads_typed((row["type"], row["checkpoint"])),
            metadata=metadata,
            parent_config=_config(session_id, ns, parent) if parent else None,
            pending_writes=[
                (task_id, channel, self.serde.loads_typed((kind, blob)))
                for task_id, channel, kind, blob in pending
            ],
        )

    # -- writes ----------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (committed before the graph goes on)."""
        configurable = config["configurable"]
        session_id, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        kind, blob = self.serde.dumps_typed(checkpoint)
        meta = json.dumps(get_checkpoint_metadata(config, metadata), default=str)
        values = {
            "session_id": session_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "message_id": self.message_id,
            "type": kind,
            "checkpoint": blob,
            "metadata": meta,
            "created_at": datetime.now(UTC),
        }
        with self.engine.begin() as conn:
            self._check_turn(conn)
            statement = _insert(conn, checkpoints).values(**values)
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=["session_id", "checkpoint_ns", "checkpoint_id"],
                    set_={"type": kind, "checkpoint": blob, "metadata": meta},
                )
            )
        return _config(session_id, ns, checkpoint["id"])

    def _check_turn(self, conn: Any) -> None:
        """A turn rolled back (``cancel(action="rollback")``, the rollback double text)
        had its checkpoints removed: its graph, still running, must not write more, or
        the next turn would start from them. The inbox row is locked so a rollback
        committing now waits for this checkpoint and removes it too."""
        if self.message_id is None:
            return
        found = conn.execute(
            select(inbox.c.state).where(inbox.c.message_id == self.message_id).with_for_update()
        ).first()
        if found is not None and found.state == InboxState.ROLLED_BACK:
            raise StaleStateError(f"turn {self.message_id} was rolled back: its graph stops")

    def put_writes(
        self,
        config: RunnableConfig,
        writes_: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes (special channels replace, others are kept once)."""
        configurable = config["configurable"]
        keys = {
            "session_id": str(configurable["thread_id"]),
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id,
        }
        with self.engine.begin() as conn:
            for idx, (channel, value) in enumerate(writes_):
                kind, blob = self.serde.dumps_typed(value)
                index = WRITES_IDX_MAP.get(channel, idx)
                row = {**keys, "idx": index, "channel": channel, "type": kind, "blob": blob}
                statement = _insert(conn, writes).values(**row, task_path=task_path)
                primary = [*keys, "idx"]
                if index < 0:  # an error, an interrupt...: the latest one counts
                    update = {"channel": channel, "type": kind, "blob": blob}
                    conn.execute(
                        statement.on_conflict_do_update(index_elements=primary, set_=update)
                    )

    def delete_thread(self, thread_id: str) -> None:
        """Delete the session's checkpoints and writes."""
        with self.engine.begin() as conn:
            for table in (writes, checkpoints):
                conn.execute(delete(table).where(and_(table.c.session_id == thread_id)))


def _insert(conn: Any, table: Any) -> Any:
    dialect = conn.engine.dialect.name
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table)


def _config(session_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": session_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }
