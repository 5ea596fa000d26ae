"""The command line's plumbing: how a failure is reported (one line, or one JSON object),
argument types, the database check of the read-only commands, and the builders every
command module uses."""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import sqlite3
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError as DatabaseError

from config import Settings, get_settings, redact_url, settings_error_line
from state.errors import (
    AgentStateError,
    BadInputError,
    DatabaseNotFoundError,
    NotFoundError,
    ServiceUnavailableError,
)

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# The distribution's name on PyPI ("agentstate" there is another project); the import
# packages and the command are still agentstate's.
DISTRIBUTION = "agentstate-celery"
# The "kind" of a JSON error, by exit status: 2 bad_input | not_found; 1 unavailable |
# timeout | failure; 130 interrupted.
KINDS = ("bad_input", "not_found", "unavailable", "timeout", "failure", "interrupted")


@dataclass(frozen=True)
class Failure:
    """How a command failed: exit status, kind (one of KINDS) and a one-line message."""

    status: int
    kind: str
    message: str


def _settings_line(exc: BaseException) -> str:
    return settings_error_line(exc) if isinstance(exc, ValidationError) else str(exc)


def _unreachable(what: str, variable: str) -> Callable[[BaseException], str]:
    def line(exc: BaseException) -> str:
        detail = exc.orig if isinstance(exc, DatabaseError) else exc
        return f"cannot reach {what}: {detail} (check {variable})"

    return line


# The first row an exception is an instance of says how it is reported. Order matters:
# subclasses come before their bases.
_RULES: list[tuple[tuple[type[BaseException], ...], int, str, Callable[[BaseException], str]]] = [
    ((KeyboardInterrupt,), EXIT_INTERRUPTED, "interrupted", lambda _: "interrupted"),
    ((ValidationError,), EXIT_BAD_INPUT, "bad_input", _settings_line),  # AGENTSTATE_* values
    ((NotFoundError,), EXIT_BAD_INPUT, "not_found", str),
    ((BadInputError,), EXIT_BAD_INPUT, "bad_input", str),
    ((TimeoutError,), EXIT_FAILURE, "timeout", str),
    (
        (redis.RedisError,),
        EXIT_FAILURE,
        "unavailable",
        _unreachable("Redis", "AGENTSTATE_REDIS_URL"),
    ),
    (
        (BrokerError,),
        EXIT_FAILURE,
        "unavailable",
        _unreachable("the broker", "AGENTSTATE_BROKER_URL"),
    ),
    (
        (DatabaseError,),
        EXIT_FAILURE,
        "unavailable",
        _unreachable("the database", "AGENTSTATE_DATABASE_URL"),
    ),
    ((ServiceUnavailableError,), EXIT_FAILURE, "unavailable", str),
    ((AgentStateError,), EXIT_FAILURE, "failure", str),
]


def failure_of(exc: BaseException) -> Failure | None:
    """How the CLI reports ``exc``; None for an unexpected error (a bug: its traceback shows)."""
    for types, status, kind, describe in _RULES:
        if isinstance(exc, types):
            return Failure(status, kind, describe(exc))
    return None


def unexpected(exc: BaseException) -> Failure:
    """An error no rule expects (a bug, ours or an imported module's): its traceback goes
    to stderr, and it is reported like any failure (exit 1; with --json, the document)."""
    traceback.print_exception(exc, file=sys.stderr)
    return Failure(EXIT_FAILURE, "failure", f"{type(exc).__name__}: {exc}")


def stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (``agentstate ... | head`` after
    head's lines), not some socket that broke."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError):
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


def reader_gone() -> int:
    """End quietly for a reader that stopped reading (exit 0): what is left unprinted
    goes nowhere, instead of a BrokenPipeError at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OK


def one_line(message: str) -> str:
    """The first line of ``message``, credentials in URLs hidden."""
    lines = redact_url(message).strip().splitlines()
    return lines[0] if lines else "failed"


def report(failure: Failure, as_json: bool) -> int:
    """Print the failure (JSON on stdout, or one line on stderr); return its exit status."""
    line = one_line(failure.message)
    if as_json:
        print(json.dumps({"error": line, "kind": failure.kind}))
    else:
        print(f"agentstate: error: {line}", file=sys.stderr)
    return failure.status


def installed_version() -> str:
    """The installed distribution's version (from its metadata, so it is the one pip
    installed, not a copy in the source)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def whole_number(text: str) -> int:
    """An argparse type: a whole number >= 0 (a revision, a seq)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def database_label(settings: Settings) -> str:
    """The database in use, for messages: credentials hidden, a SQLite path made absolute."""
    path = _sqlite_file(settings)
    return f"sqlite:///{path}" if path else redact_url(settings.database_url)


def check_readable(settings: Settings) -> None:
    """Refuse a database that reading would create: a SQLite file that is not there, or a
    database without the agentstate schema (DatabaseNotFoundError)."""
    from state.storage.db import current_revision, get_engine

    where = database_label(settings)
    path = _sqlite_file(settings)
    if path is not None and not path.exists():
        raise DatabaseNotFoundError(f"no database at {where} (AGENTSTATE_DATABASE_URL)")
    if path is not None:
        found = _sqlite_has_schema(path, where)  # read-only: an empty file stays untouched
    else:
        found = current_revision(get_engine(settings.database_url)) is not None
    if not found:
        raise DatabaseNotFoundError(
            f"no agentstate schema in {where} (AGENTSTATE_DATABASE_URL; "
            "`agentstate db upgrade` creates it)"
        )


@contextmanager
def noting_a_new_database() -> Iterator[None]:
    """Say so on stderr when the command creates the SQLite database (its absolute
    path: where a worker must find it too)."""
    try:
        path = _sqlite_file(get_settings())
    except (ValidationError, AgentStateError):
        path = None  # the command reports a bad setting itself, if it needs one
    existed = path is None or path.exists()
    yield
    if not existed and path is not None and path.exists():
        print(f"agentstate: created the database sqlite:///{path}", file=sys.stderr)


def _sqlite_has_schema(path: Path, where: str) -> bool:
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
            row = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise DatabaseNotFoundError(f"{where} is not a database: {exc}") from exc
    return row is not None


def _sqlite_file(settings: Settings) -> Path | None:
    url = make_url(settings.database_url)
    name = url.database
    if url.get_backend_name() != "sqlite" or not name or name == ":memory:" or url.query:
        return None  # in memory, or a URI filename whose meaning is SQLite's
    return Path(name).resolve()


# -- building commands ------------------------------------------------------------

Handler = Callable[[argparse.Namespace], Any]


def command(sub: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    """A subcommand with ``--json``, run by ``handler``."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=handler)
    return parser


def as_user(parser: argparse.ArgumentParser, what: str) -> None:
    """``--user USER_ID``: act as that user, to whom another user's ``what`` is unknown
    (the client's ``user_id=``); without it the command line is the trusted operator."""
    parser.add_argument(
        "--user",
        type=user_id,
        metavar="USER_ID",
        help=f"act as this user: another user's {what} is unknown (exit 2), nothing changed",
    )


def user_id(text: str) -> str:
    """An argparse type: a valid user id."""
    from state.errors import InvalidIdError
    from state.ids import validate_id

    try:
        return validate_id(text, "user")
    except InvalidIdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def group(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A group of subcommands; named alone, it prints its own help."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(help_of=parser)
    return parser


def client() -> Any:
    """An AgentClient from the environment's Settings."""
    from tasks.client import AgentClient

    return AgentClient()


def reader() -> Any:
    """A client for the read-only commands, after checking that reading creates nothing."""
    check_readable(get_settings())
    return client()


def unknown(kind: str, item_id: str) -> NotFoundError:
    """The error for an id that names nothing, saying which database was searched."""
    return NotFoundError(f"unknown {kind} {item_id!r} in {database_label(get_settings())}")


def emit(args: argparse.Namespace, data: Any, human: Callable[[], None]) -> None:
    """Print ``data`` as JSON with ``--json``, else call ``human`` to print it as text."""
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        human()
