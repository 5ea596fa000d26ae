"""Generations: a number minted when a session or workflow row is created, never reused.

Erasure and retention free ids, and anyone may take a freed id again. Everything a process
keeps about a row past one statement (a worker's memo of a workflow's context, a follower
of a session's events, a step's claim) is bound to the row's generation, so nothing of an
old generation reaches a new one of the same id, nor the reverse.

On Postgres the number comes from one sequence (``agentstate_generation``, migration 0021):
strictly never reused. SQLite has no sequences; it draws 63 random bits, which a second
row of the same id matches with negligible odds.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

SEQUENCE = "agentstate_generation"


class NewGeneration(FunctionElement[int]):
    """The SQL that mints a generation, written in the INSERT of the row it belongs to."""

    type = BigInteger()
    inherit_cache = True


@compiles(NewGeneration, "postgresql")
def _postgres(element: NewGeneration, compiler: Any, **kw: Any) -> str:
    return f"nextval('{SEQUENCE}')"


@compiles(NewGeneration)
def _other(element: NewGeneration, compiler: Any, **kw: Any) -> str:
    return "abs(random())"
