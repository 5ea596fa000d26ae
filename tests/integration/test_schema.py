"""The Alembic migrations build exactly the schema the table models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from config import Settings
from state.storage.db import get_engine
from state.storage.tables import Base


def test_migrations_match_the_models(settings: Settings) -> None:
    engine = get_engine(settings.database_url)
    with engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert differences == []
