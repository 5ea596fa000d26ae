"""Service URLs carry passwords: they are checked when Settings load, and no password
reaches an error line, a log record or a traceback.

Three layers: a malformed URL is refused with a message that names its variable and
nothing of its value (``check_url``); URLs inside messages lose their credentials
(``redact_url``); and the passwords of every URL Settings accepted are scrubbed from log
records by value (``SecretFilter``), whatever library echoed them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from state.errors import ConfigurationError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
# RFC 3986 userinfo: unreserved, sub-delims, ":" and %XX; every other character must be
# percent-escaped, or parsers disagree about where the password ends.
_USERINFO = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*")
_HOST_PORT = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~!$&'()*+;=]|%[0-9A-Fa-f]{2})*)(?::(?P<port>\d*))?"
)
_MAX_PORT = 65535
_HINT = (
    "percent-escape special characters in the user name and password "
    "(% as %25, @ as %40, / as %2F, # as %23, ? as %3F, ; as %3B)"
)

# Up to the last "@" of a whitespace-free run: passwords may themselves contain "@", and
# a malformed one may contain "/" (hiding a host too much beats showing a password).
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<cred>\S*)@")
# libpq DSNs and URL query strings: "password=..." after a separator or at the start.
_QUERY_PASSWORD = re.compile(r"(?i)(?P<key>(?<![^?&;\s])(?:password|passwd|pwd)=)[^&;\s]*")
# Shorter passwords are not scrubbed by value: replacing every "ab" would garble logs.
MIN_SCRUBBED_LENGTH = 4


class _Secrets:
    """The passwords of every accepted URL, longest first (so that a password containing
    another is hidden whole)."""

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.ordered: tuple[str, ...] = ()
        self.guard = threading.Lock()

    def add(self, values: set[str]) -> None:
        new = {v for v in values if len(v) >= MIN_SCRUBBED_LENGTH} - self.known
        if new:
            with self.guard:
                self.known.update(new)
                self.ordered = tuple(sorted(self.known, key=len, reverse=True))


_secrets = _Secrets()


def redact_url(text: str) -> str:
    """Hide the user:password part (and ``password=`` parameters) of every URL in ``text``."""
    if "://" not in text and "=" not in text:  # the common case, cheaply
        return text
    text = _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group('key')}***", text)


def url_problem(url: str) -> str | None:
    """What is wrong with ``url``, in words that quote nothing of it (None if nothing)."""
    if not url:
        return "it is empty"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return f"it contains whitespace or a control character; {_HINT}"
    scheme, separator, rest = url.partition("://")
    if not separator or not _SCHEME.fullmatch(scheme):
        # Written so that redaction (which hides what sits between "://" and "@") leaves
        # it whole when it is printed.
        return "expected scheme://host[:port][/path], with user:password@ before the host"
    return _authority_problem(rest)


def _authority_problem(rest: str) -> str | None:
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if authority and "@" in rest[len(authority) :]:
        return f"the user name or password contains an unescaped '/', '?' or '#'; {_HINT}"
    userinfo, at, hosts = authority.rpartition("@")
    if at and not _USERINFO.fullmatch(userinfo):
        return f"the user name or password contains a character that must be escaped; {_HINT}"
    for host in hosts.split(","):  # libpq and Redis Sentinel accept lists of hosts
        match = _HOST_PORT.fullmatch(host)
        if match is None or int(match.group("port") or 0) > _MAX_PORT:
            return f"the host or port is malformed (a port is a number up to 65535); {_HINT}"
    return None


def check_url(variable: str, url: str, *, alternatives: bool = False) -> str:
    """``url`` if it is well formed, else ConfigurationError naming ``variable`` only.

    With ``alternatives``, ``url`` may be a ``;``-separated failover list (Celery's
    broker URL). The passwords of an accepted URL are scrubbed from logs from now on.
    """
    for part in url.split(";") if alternatives else [url]:
        problem = url_problem(part)
        if problem is not None:
            raise ConfigurationError(f"{variable} is not a valid URL: {problem}")
        remember_secrets(part)
    return url


def remember_secrets(url: str) -> None:
    """Scrub the password of ``url`` (as written, decoded and re-escaped) from logs."""
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo = authority.rpartition("@")[0]
    found = [userinfo.partition(":")[2]]
    found += [m.group(0).split("=", 1)[1] for m in _QUERY_PASSWORD.finditer(rest)]
    _secrets.add({form for written in found for form in _spellings(written)})


def remember_secret_values(values: set[str]) -> None:
    """Scrub these secrets (API keys) from logs, as the passwords of accepted URLs are."""
    _secrets.add(values)


def _spellings(written: str) -> set[str]:
    """A password as written in the URL, decoded, re-escaped, and quoted the ways
    ``repr`` and JSON quote it inside a message (a logged exception is often a repr)."""
    raw = unquote(written)
    backslashed = raw.replace("\\", "\\\\")
    return {
        written,
        raw,
        quote(raw, safe=""),
        backslashed,
        backslashed.replace("'", "\\'"),
        backslashed.replace('"', '\\"'),
        json.dumps(raw)[1:-1],
    }


def scrub(text: str) -> str:
    """``text`` without URL credentials and without any password Settings accepted."""
    text = redact_url(text)
    for secret in _secrets.ordered:
        if secret in text:
            text = text.replace(secret, "***")
    return text


class SecretFilter(logging.Filter):
    """Scrubs a record's message, traceback and stack before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            clean = scrub(message)
            if clean != message:
                _scrub_record(record, clean)
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = scrub(record.exc_text)
            if record.stack_info:
                record.stack_info = scrub(record.stack_info)
        except Exception:  # a filter must never stop a record from being logged
            return True
        return True


def _scrub_record(record: logging.LogRecord, clean: str) -> None:
    """Scrub the record's arguments one by one where that is enough, so a formatter that
    reads them (uvicorn's access log takes its five) still formats it; else the message
    as a whole, without arguments."""
    if isinstance(record.args, tuple) and record.args and isinstance(record.msg, str):
        args = tuple(scrub(a) if isinstance(a, str) else a for a in record.args)
        msg = scrub(record.msg)
        try:
            scrubbed = msg % args
        except (TypeError, ValueError):
            scrubbed = None
        if scrubbed is not None and scrub(scrubbed) == scrubbed:
            record.msg, record.args = msg, args
            return
    record.msg, record.args = clean, None


def hide_secrets_in(logger: logging.Logger) -> None:
    """Put a SecretFilter on every handler of ``logger`` (once each)."""
    for handler in logger.handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())


def read_secret_file(variable: str, path: str) -> str:
    """The value in the file ``variable`` names (a Docker or Kubernetes secret), without
    the trailing newline editors add; ConfigurationError if it is unreadable or empty."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigurationError(f"{variable}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"{variable}: {path} is not UTF-8 text") from None
    if not value:
        raise ConfigurationError(f"{variable}: {path} is empty")
    return value


# The database backends (and drivers) the stores are written and tested for.
DATABASE_DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg2",)}
REDIS_SCHEMES = ("redis", "rediss", "unix")
_BROKER_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")


# Heroku, Render, Fly and most hosted Postgres write postgres://; SQLAlchemy knows the
# dialect only as postgresql. Both spellings without a driver mean the driver we ship.
_POSTGRES_SCHEME = re.compile(r"^postgres(?:ql)?(?=://)", re.IGNORECASE)


def normalise_database_url(url: str) -> str:
    """``url`` in SQLAlchemy's driver form: ``postgres://`` and ``postgresql://`` become
    ``postgresql+psycopg2://`` (the rest of the URL as written); anything else unchanged."""
    return _POSTGRES_SCHEME.sub("postgresql+psycopg2", url, count=1)


def check_database_url(url: str) -> str:
    """``url`` if SQLAlchemy can parse it and it names a supported backend and driver."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ValueError("not a database URL (postgresql+psycopg2://... or sqlite:///...)") from exc
    backend = parsed.get_backend_name()
    if parsed.drivername == "postgresql":
        return url  # no driver named: the engine uses psycopg2 (see state.storage.db)
    # The driver is only looked up for a known backend (it imports the dialect).
    driver = parsed.get_driver_name() if backend in DATABASE_DRIVERS else None
    if driver not in DATABASE_DRIVERS.get(backend, ()):
        used = f" (driver {driver})" if driver else ""
        raise ValueError(
            f"unsupported database {parsed.drivername!r}{used}: "
            "use postgresql+psycopg2://... or sqlite:///..."
        )
    return url


def absolute_sqlite_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute against the current folder
    (``sqlite:///agentstate.db`` -> ``sqlite:////srv/app/agentstate.db``); any other URL,
    an in-memory database and a URI filename unchanged."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:":
        return url
    if parsed.query or name.startswith("file:") or os.path.isabs(name):
        return url  # a URI filename means what SQLite makes of it; absolute already
    return parsed.set(database=os.path.abspath(name)).render_as_string(hide_password=False)


def check_redis_url(url: str) -> str:
    """``url`` if redis-py can connect with it (scheme, port, database number)."""
    from redis.connection import parse_url

    if url.startswith("redis+sentinel://"):
        from config.sentinel import SentinelURL

        SentinelURL.parse(url)  # ConfigurationError naming what is wrong
        return url
    if not url.startswith(tuple(f"{scheme}://" for scheme in REDIS_SCHEMES)):
        raise ValueError("not a Redis URL (redis://, rediss://, unix:// or redis+sentinel://)")
    parse_url(url)  # type: ignore[no-untyped-call]  # raises ValueError naming the problem
    return url


def check_broker_url(url: str) -> str:
    """``url`` if it looks like a kombu broker URL ('' means: the Redis URL)."""
    for part in filter(None, url.split(";")):  # kombu's failover list
        if not _BROKER_SCHEME.match(part):
            raise ValueError("not a broker URL (redis://... or amqp://...)")
        if part.startswith(("redis://", "rediss://", "redis+sentinel://")):
            check_redis_url(part)
        else:
            urlsplit(part).port  # noqa: B018 - raises ValueError for a port that is no number
    return url
