"""What tests of the data lifecycle look with: every row of every table and every Redis
key that names one of some ids (a user, their sessions, their workflows)."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import Engine, text


def tables(engine: Engine) -> list[str]:
    """Every table of the database (those other branches add included)."""
    with engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            )
            if r[0] != "alembic_version"
        ]


def rows_naming(engine: Engine, ids: list[str]) -> dict[str, list[str]]:
    """Table -> each row (as text) that contains one of ``ids``, sorted."""
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for table in tables(engine):
            hits: list[str] = []
            for chunk in range(0, len(ids), 50):
                names = ids[chunk : chunk + 50]
                hits += [
                    str(r[0])
                    for r in conn.execute(
                        text(f'SELECT t::text FROM "{table}" t WHERE t::text LIKE ANY(:p)'),
                        {"p": [f"%{name}%" for name in names]},
                    )
                ]
            if hits:
                found[table] = sorted(set(hits))
    return found


def keys_naming(client: redis.Redis, ids: list[str]) -> dict[str, Any]:
    """Each Redis key whose name contains one of ``ids``, with its value (hash, list,
    string), for comparing before and after."""
    found: dict[str, Any] = {}
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        if any(name in key for name in ids):
            found[key] = _value(client, key)
    return found


def _value(client: redis.Redis, key: str) -> Any:
    kind = str(client.type(key), "utf-8")  # type: ignore[arg-type]
    if kind == "hash":
        return client.hgetall(key)
    if kind == "list":
        return client.lrange(key, 0, -1)
    if kind == "string":
        return client.get(key)
    return kind
