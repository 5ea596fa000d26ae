"""Alembic environment: runs on the connection agentstate hands it, or on the URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from state.storage.tables import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # agentstate's alembic_config passes its engine; alembic.ini (by hand) passes a URL.
    engine = config.attributes.get("engine") or create_engine(
        config.get_main_option("sqlalchemy.url") or ""
    )
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
