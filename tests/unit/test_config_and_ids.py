"""Settings from AGENTSTATE_*, URL redaction, the id rule and the Celery configuration."""

from __future__ import annotations

import io
import logging
import os
import string
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from celery.utils.log import ColorFormatter
from pydantic import ValidationError
from sqlalchemy.pool import QueuePool

from config import HopPolicy, Settings, child_environment, get_settings, redact_url
from config.celery import celery_config
from config.urls import SecretFilter, hide_secrets_in
from state.errors import BadInputError, ConfigurationError, InvalidIdError
from state.ids import validate_id


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No AGENTSTATE_* variable set, and a settings cache that is re-read before and after."""
    for name in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
        monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


# --- Settings -------------------------------------------------------------------------


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = get_settings()
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.broker_url == "redis://localhost:6379/0"
    assert s.database_url == f"sqlite:///{Path.cwd() / 'agentstate.db'}"  # made absolute
    assert s.lock_timeout == 30
    assert s.session_ttl == 3600
    assert s.cache_ttl == 3600
    assert s.execution_timeout == 30
    assert s.retry_backoff == 1
    assert s.agent == "tasks.agent"
    assert s.action_modules == ""
    assert s.action_module_list == []
    assert s.max_message_bytes == 65536
    assert s.stuck_after == 60.0
    assert isinstance(s.stuck_after, float)
    assert s.hop_policy == HopPolicy.EVERY_PHASE
    assert s.hop_policy.value == "every_phase"
    assert s.max_calculations_per_message == 20
    assert s.max_reply_bytes == 16384
    assert s.max_facts == 100
    assert s.max_fact_bytes == 2048


def test_get_settings_is_cached(clean_env: pytest.MonkeyPatch) -> None:
    first = get_settings()
    assert get_settings() is first
    clean_env.setenv("AGENTSTATE_AGENT", "other.agent")
    assert get_settings().agent == "tasks.agent"  # cached until cleared
    get_settings.cache_clear()
    assert get_settings().agent == "other.agent"


def test_broker_url_defaults_to_redis_url(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTSTATE_REDIS_URL", "redis://cache:6380/2")
    s = get_settings()
    assert s.redis_url == "redis://cache:6380/2"
    assert s.broker_url == "redis://cache:6380/2"


def test_broker_url_can_differ_from_redis_url(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTSTATE_REDIS_URL", "redis://cache:6380/2")
    clean_env.setenv("AGENTSTATE_BROKER_URL", "redis://broker:6379/5")
    s = get_settings()
    assert s.redis_url == "redis://cache:6380/2"
    assert s.broker_url == "redis://broker:6379/5"


EVERY_VARIABLE: dict[str, tuple[str, str, Any]] = {
    # variable: (value set, field, expected value)
    "AGENTSTATE_REDIS_URL": ("redis://r:1/3", "redis_url", "redis://r:1/3"),
    "AGENTSTATE_BROKER_URL": ("redis://b:2/4", "broker_url", "redis://b:2/4"),
    "AGENTSTATE_DATABASE_URL": (
        "postgresql+psycopg2://db/x",
        "database_url",
        "postgresql+psycopg2://db/x",
    ),
    "AGENTSTATE_LOCK_TIMEOUT": ("12", "lock_timeout", 12),
    "AGENTSTATE_SESSION_TTL": ("99", "session_ttl", 99),
    "AGENTSTATE_CACHE_TTL": ("77", "cache_ttl", 77),
    "AGENTSTATE_EXECUTION_TIMEOUT": ("5", "execution_timeout", 5),
    "AGENTSTATE_RETRY_BACKOFF": ("0.25", "retry_backoff", 0.25),
    "AGENTSTATE_AGENT": ("my.agent", "agent", "my.agent"),
    "AGENTSTATE_ACTION_MODULES": ("a.b,c", "action_modules", "a.b,c"),
    "AGENTSTATE_MAX_MESSAGE_BYTES": ("1024", "max_message_bytes", 1024),
    "AGENTSTATE_STUCK_AFTER": ("2.5", "stuck_after", 2.5),
    "AGENTSTATE_HOP_POLICY": ("inline", "hop_policy", HopPolicy.INLINE),
    "AGENTSTATE_MAX_CALCULATIONS_PER_MESSAGE": ("5", "max_calculations_per_message", 5),
    "AGENTSTATE_MAX_REPLY_BYTES": ("4096", "max_reply_bytes", 4096),
    "AGENTSTATE_MAX_FACTS": ("10", "max_facts", 10),
    "AGENTSTATE_MAX_FACT_BYTES": ("512", "max_fact_bytes", 512),
    "AGENTSTATE_DB_POOL_SIZE": ("3", "db_pool_size", 3),
    "AGENTSTATE_DB_MAX_OVERFLOW": ("4", "db_max_overflow", 4),
    "AGENTSTATE_TASK_SOFT_TIME_LIMIT": ("100", "task_soft_time_limit", 100),
    "AGENTSTATE_TASK_TIME_LIMIT": ("200", "task_time_limit", 200),
    "AGENTSTATE_WORKER_MAX_MEMORY_PER_CHILD": ("1024", "worker_max_memory_per_child", 1024),
}


def test_every_variable_is_read_together(clean_env: pytest.MonkeyPatch) -> None:
    for name, (value, _, _) in EVERY_VARIABLE.items():
        clean_env.setenv(name, value)
    s = get_settings()
    for name, (_, field, expected) in EVERY_VARIABLE.items():
        assert getattr(s, field) == expected, name


@pytest.mark.parametrize("name", list(EVERY_VARIABLE))
def test_each_variable_is_read(clean_env: pytest.MonkeyPatch, name: str) -> None:
    value, field, expected = EVERY_VARIABLE[name]
    default = getattr(Settings(), field)
    assert default != expected, "pick a test value that differs from the default"
    clean_env.setenv(name, value)
    assert getattr(get_settings(), field) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", []),
        ("one", ["one"]),
        ("a.b,c.d", ["a.b", "c.d"]),
        (" a.b , c.d ,", ["a.b", "c.d"]),
        (",,x,,", ["x"]),
    ],
)
def test_action_module_list_splits_commas(
    clean_env: pytest.MonkeyPatch, value: str, expected: list[str]
) -> None:
    clean_env.setenv("AGENTSTATE_ACTION_MODULES", value)
    assert get_settings().action_module_list == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AGENTSTATE_LOCK_TIMEOUT", "-1"),
        ("AGENTSTATE_LOCK_TIMEOUT", "0"),
        ("AGENTSTATE_EXECUTION_TIMEOUT", "-5"),
        ("AGENTSTATE_SESSION_TTL", "-1"),
        ("AGENTSTATE_CACHE_TTL", "0"),
        ("AGENTSTATE_CACHE_TTL", "1.5"),
        ("AGENTSTATE_RETRY_BACKOFF", "-0.1"),
        ("AGENTSTATE_MAX_MESSAGE_BYTES", "0"),
        ("AGENTSTATE_STUCK_AFTER", "-1"),
        ("AGENTSTATE_STUCK_AFTER", "soon"),
        ("AGENTSTATE_HOP_POLICY", "sometimes"),
        ("AGENTSTATE_HOP_POLICY", "INLINE!"),
        ("AGENTSTATE_AGENT", "   "),
        ("AGENTSTATE_MAX_CALCULATIONS_PER_MESSAGE", "0"),
        ("AGENTSTATE_MAX_REPLY_BYTES", "10"),  # no room for a sentence and an ellipsis
        ("AGENTSTATE_MAX_FACTS", "0"),
        ("AGENTSTATE_MAX_FACT_BYTES", "0"),
        ("AGENTSTATE_DB_POOL_SIZE", "0"),
        ("AGENTSTATE_DB_MAX_OVERFLOW", "-1"),
        ("AGENTSTATE_TASK_TIME_LIMIT", "-1"),
        ("AGENTSTATE_WORKER_MAX_MEMORY_PER_CHILD", "-1"),
    ],
)
def test_invalid_values_are_refused(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(ValidationError):
        get_settings()


def test_settings_are_frozen(clean_env: pytest.MonkeyPatch) -> None:
    s = get_settings()
    with pytest.raises(ValidationError):
        s.lock_timeout = 1  # type: ignore[misc]


# --- redact_url -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("postgresql://user:hunter2@db:5432/app", "hunter2"),
        ("postgresql+psycopg2://agent:s3cr3t@127.0.0.1/x", "s3cr3t"),
        ("redis://:topsecret@localhost:6379/0", "topsecret"),
        ("redis://default:pa55@h:6379/0 failed", "pa55"),
        ("error connecting to amqp://guest:guestpw@rabbit// (timeout)", "guestpw"),
    ],
)
def test_redact_url_hides_credentials(text: str, secret: str) -> None:
    out = redact_url(text)
    assert secret not in out
    assert "***@" in out


def test_redact_url_keeps_the_rest_of_the_text() -> None:
    text = "db postgresql://u:p@h:5432/app and broker redis://:x@r:6379/1 down"
    assert redact_url(text) == "db postgresql://***@h:5432/app and broker redis://***@r:6379/1 down"


def test_redact_url_hides_a_password_containing_at_sign() -> None:
    # redis-py (urllib) reads the password up to the last '@': here it is "p@ss".
    assert redact_url("redis://:p@ss@localhost:6379/0") == "redis://***@localhost:6379/0"


@pytest.mark.parametrize(
    "text",
    ["redis://localhost:6379/0", "sqlite:///agentstate.db", "no url here", "mail me@example.org"],
)
def test_redact_url_leaves_urls_without_credentials(text: str) -> None:
    assert redact_url(text) == text


@pytest.mark.parametrize("special", ["@", "/", "#", ":", "%", "@/#:%", "%40", "%2F%23"])
def test_redact_url_hides_passwords_with_special_characters(special: str) -> None:
    password = f"Zq7{special}Secret"
    for url in (
        f"postgresql+psycopg2://agent:{password}@db:5432/app",
        f"redis://:{password}@cache:6379/0",
        f"redis://agent:{password}@cache:6379/0",
    ):
        out = redact_url(f"failed on '{url}' at position 3")
        assert "Zq7" not in out, out
        assert "Secret" not in out, out
        assert out.endswith("' at position 3")


@pytest.mark.parametrize(
    "text",
    [
        "redis+socket:///tmp/redis.sock?db=0&password=Zq7Secret",
        "host=db dbname=app password=Zq7Secret user=agent",
        "amqp://h//?PASSWORD=Zq7Secret",
    ],
)
def test_redact_url_hides_password_parameters(text: str) -> None:
    assert "Zq7Secret" not in redact_url(text)
    assert "***" in redact_url(text)


# --- URLs in Settings -------------------------------------------------------------------

URL_VARIABLES = ["AGENTSTATE_DATABASE_URL", "AGENTSTATE_REDIS_URL", "AGENTSTATE_BROKER_URL"]
ESCAPED_PASSWORD = quote("Zq7" + string.punctuation + " é", safe="")


@pytest.mark.parametrize("variable", URL_VARIABLES)
@pytest.mark.parametrize(
    "credentials",
    [
        "agent:Zq7#Secret",
        "agent:Zq7/Secret",
        "agent:Zq7?Secret",
        "agent:Zq7@Secret",
        "agent:Zq7 Secret",
        "agent:Zq7%zzSecret",
        "agent:12/Zq7Secret",
        "agent:Zq7Secret\n",
        "agent:Zq7é",
    ],
)
def test_a_malformed_url_names_its_variable_and_nothing_of_it(
    clean_env: pytest.MonkeyPatch, variable: str, credentials: str
) -> None:
    scheme = "postgresql+psycopg2" if variable == "AGENTSTATE_DATABASE_URL" else "redis"
    clean_env.setenv(variable, f"{scheme}://{credentials}@127.0.0.1:5432/0")
    with pytest.raises(ConfigurationError) as info:
        get_settings()
    message = str(info.value)
    assert isinstance(info.value, BadInputError)
    assert message.startswith(f"{variable} is not a valid")
    assert "\n" not in message
    assert "Zq7" not in message
    assert info.value.__suppress_context__ or info.value.__context__ is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENTSTATE_REDIS_URL", "localhost:6379"),
        ("AGENTSTATE_REDIS_URL", "redis://cache:99999/0"),
        ("AGENTSTATE_BROKER_URL", "redis://cache:abc/0"),
        ("AGENTSTATE_DATABASE_URL", "postgres ql://u@h/db"),
        ("AGENTSTATE_DATABASE_URL", "postgresql://u:p@h1:5432,h2:5433/db"),
    ],
)
def test_other_malformed_urls_are_refused(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"^{variable} is not a valid"):
        get_settings()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////srv/agentstate.db",  # relative paths are made absolute: test_sqlite_path
        "sqlite:///:memory:",
        "postgresql+psycopg2:///app?host=/var/run/postgresql",
        "postgresql+psycopg2://agent@[::1]:5432/app",
    ],
)
def test_database_urls_without_passwords_stay_valid(
    clean_env: pytest.MonkeyPatch, url: str
) -> None:
    clean_env.setenv("AGENTSTATE_DATABASE_URL", url)
    assert get_settings().database_url == url


@pytest.mark.parametrize(
    ("written", "read"),
    [
        (
            "postgres://agent:Zq7%40pw@db:5432/app",
            "postgresql+psycopg2://agent:Zq7%40pw@db:5432/app",
        ),
        (
            "postgresql://agent@db/app?sslmode=require",
            "postgresql+psycopg2://agent@db/app?sslmode=require",
        ),
        ("POSTGRES://agent@db/app", "postgresql+psycopg2://agent@db/app"),
        ("postgresql+psycopg2://agent@db/app", "postgresql+psycopg2://agent@db/app"),
    ],
)
@pytest.mark.parametrize("source", ["variable", "file"])
def test_postgres_urls_are_read_in_the_driver_form(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, written: str, read: str, source: str
) -> None:
    # postgres:// is what hosted Postgres hands out; SQLAlchemy knows only postgresql.
    if source == "file":
        (tmp_path / "db").write_text(written + "\n")
        clean_env.setenv("AGENTSTATE_DATABASE_URL_FILE", str(tmp_path / "db"))
    else:
        clean_env.setenv("AGENTSTATE_DATABASE_URL", written)
    assert get_settings().database_url == read
    from state.storage.async_db import async_url
    from state.storage.db import get_engine

    assert get_engine(written).url.drivername == "postgresql+psycopg2"  # never connected
    assert async_url(written).startswith("postgresql+psycopg_async://")


def test_percent_escaped_passwords_reach_every_client_intact(clean_env: pytest.MonkeyPatch) -> None:
    from kombu.utils.url import parse_url
    from redis.connection import parse_url as redis_parse_url
    from sqlalchemy.engine import make_url

    raw = unquote(ESCAPED_PASSWORD)
    clean_env.setenv("AGENTSTATE_DATABASE_URL", f"postgresql://a%40b:{ESCAPED_PASSWORD}@db/app")
    clean_env.setenv("AGENTSTATE_REDIS_URL", f"redis://a%40b:{ESCAPED_PASSWORD}@cache:6379/0")
    clean_env.setenv(
        "AGENTSTATE_BROKER_URL",
        f"redis://:{ESCAPED_PASSWORD}@b1:6379/1;redis://:{ESCAPED_PASSWORD}@b2:6379/1",
    )
    s = get_settings()
    database = make_url(s.database_url)
    assert (database.username, database.password) == ("a@b", raw)
    cache = redis_parse_url(s.redis_url)
    assert (cache["username"], cache["password"]) == ("a@b", raw)
    assert parse_url(s.broker_url.split(";")[0])["password"] == raw


def test_settings_errors_for_other_fields_stay_validation_errors(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("AGENTSTATE_REDIS_URL", f"redis://:{ESCAPED_PASSWORD}@cache:6379/0")
    clean_env.setenv("AGENTSTATE_LOCK_TIMEOUT", "-1")
    with pytest.raises(ValidationError) as info:
        get_settings()
    assert "Zq7" not in str(info.value)


@pytest.mark.parametrize("formatter", [logging.Formatter(), ColorFormatter(use_color=False)])
def test_log_records_lose_accepted_passwords(
    clean_env: pytest.MonkeyPatch, formatter: logging.Formatter
) -> None:
    clean_env.setenv("AGENTSTATE_DATABASE_URL", f"postgresql://agent:{ESCAPED_PASSWORD}@db/app")
    get_settings()
    raw = unquote(ESCAPED_PASSWORD)
    try:
        raise ValueError(f"could not use {raw!r} (escaped {ESCAPED_PASSWORD})")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed: %s", (raw,), sys.exc_info()
        )
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(formatter)
    handler.addFilter(SecretFilter())
    handler.handle(record)
    out = handler.stream.getvalue()
    assert "failed: ***" in out
    assert "ValueError: could not use" in out
    assert "Zq7" not in out


def test_hide_secrets_in_adds_one_filter_per_handler() -> None:
    logger = logging.getLogger("agentstate-test-filters")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        hide_secrets_in(logger)
        hide_secrets_in(logger)
        assert sum(isinstance(f, SecretFilter) for f in handler.filters) == 1
    finally:
        logger.removeHandler(handler)


# --- URLs from files (AGENTSTATE_*_URL_FILE) -------------------------------------------


@pytest.mark.parametrize("variable", URL_VARIABLES)
def test_a_url_can_come_from_a_file(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    scheme = "postgresql+psycopg2" if variable == "AGENTSTATE_DATABASE_URL" else "redis"
    url = f"{scheme}://agent:{ESCAPED_PASSWORD}@db:5432/1"
    secret = tmp_path / "url"
    secret.write_text(url + "\n")  # editors end files with a newline
    clean_env.setenv(f"{variable}_FILE", str(secret))
    settings = get_settings()
    field = variable.removeprefix("AGENTSTATE_").lower()
    assert getattr(settings, field) == url
    if variable == "AGENTSTATE_REDIS_URL":
        assert settings.broker_url == url  # the broker still defaults to the Redis URL


def test_a_url_file_and_its_variable_together_are_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "url").write_text("redis://cache:6379/0")
    clean_env.setenv("AGENTSTATE_REDIS_URL_FILE", str(tmp_path / "url"))
    clean_env.setenv("AGENTSTATE_REDIS_URL", "redis://other:6379/0")
    with pytest.raises(
        ConfigurationError, match=r"^set AGENTSTATE_REDIS_URL or AGENTSTATE_REDIS_URL_FILE"
    ):
        get_settings()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "AGENTSTATE_DATABASE_URL_FILE: cannot read .*: No such file or directory$"),
        ("", "AGENTSTATE_DATABASE_URL_FILE: .* is empty$"),
        (b"\xff\xfe", "AGENTSTATE_DATABASE_URL_FILE: .* is not UTF-8 text$"),
        ("postgresql://agent:Zq7#x@db/app", "^the URL in AGENTSTATE_DATABASE_URL_FILE .* not a"),
        ("postgresql://agent:Zq7@db/app\npostgresql://b@c/d", "whitespace"),
    ],
)
def test_a_bad_url_file_is_one_line_naming_it(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, content: str | bytes | None, expected: str
) -> None:
    secret = tmp_path / "url"
    if isinstance(content, bytes):
        secret.write_bytes(content)
    elif content is not None:
        secret.write_text(content)
    clean_env.setenv("AGENTSTATE_DATABASE_URL_FILE", str(secret))
    with pytest.raises(ConfigurationError, match=expected) as info:
        get_settings()
    assert "Zq7" not in str(info.value)
    assert "\n" not in str(info.value)


def test_children_read_the_same_files_and_get_no_url_in_their_environment(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "db").write_text(f"postgresql://agent:{ESCAPED_PASSWORD}@db/app")
    (tmp_path / "redis").write_text(f"redis://:{ESCAPED_PASSWORD}@cache:6379/0")
    clean_env.setenv("AGENTSTATE_DATABASE_URL_FILE", str(tmp_path / "db"))
    clean_env.setenv("AGENTSTATE_REDIS_URL_FILE", str(tmp_path / "redis"))
    parent = get_settings()
    env = child_environment(parent)
    assert not any("Zq7" in value for value in env.values())
    for name in [k for k in os.environ if k.startswith("AGENTSTATE_")]:
        clean_env.delenv(name)
    for name, value in env.items():
        if name.startswith("AGENTSTATE_"):
            clean_env.setenv(name, value)
    get_settings.cache_clear()
    assert get_settings() == parent


# --- pools, time limits, memory ---------------------------------------------------------


def test_time_limits_default_above_the_phase_deadlines(clean_env: pytest.MonkeyPatch) -> None:
    s = get_settings()
    assert (s.task_soft_time_limit, s.task_time_limit) == (300, 360)
    slow = Settings(execution_timeout=5000.0)
    assert slow.task_soft_time_limit > 5000 and slow.task_time_limit > slow.task_soft_time_limit
    only_hard = Settings(task_time_limit=50.0)
    assert 30 < only_hard.task_soft_time_limit < 50


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task_time_limit": 20.0}, "AGENTSTATE_TASK_TIME_LIMIT must be above"),
        ({"task_time_limit": 100.0, "execution_timeout": 100.0}, "must be above"),
        ({"task_soft_time_limit": 400.0}, "AGENTSTATE_TASK_SOFT_TIME_LIMIT must be below"),
    ],
)
def test_inconsistent_time_limits_are_refused(
    clean_env: pytest.MonkeyPatch, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings(**overrides)


def test_celery_gets_time_limits_and_memory_recycling(clean_env: pytest.MonkeyPatch) -> None:
    conf = celery_config(Settings(task_time_limit=100.0, worker_max_memory_per_child=2048))
    assert conf["task_time_limit"] == 100
    assert conf["task_soft_time_limit"] == 80
    assert conf["worker_max_memory_per_child"] == 2048
    assert (
        celery_config(Settings(worker_max_memory_per_child=0))["worker_max_memory_per_child"]
        is None
    )
    assert celery_config(Settings())["worker_max_memory_per_child"] == 512_000


def test_engines_use_the_pool_sizes_of_settings(clean_env: pytest.MonkeyPatch) -> None:
    from state.storage.backend import Backend
    from state.storage.db import autocommit_engine

    settings = Settings(
        database_url="postgresql+psycopg2://agent@127.0.0.1:1/nowhere",  # never connected
        db_pool_size=3,
        db_max_overflow=4,
        auto_migrate=False,
    )
    engine = Backend.build(settings).engine
    sibling = autocommit_engine(engine)
    for pool in (engine.pool, sibling.pool):
        assert isinstance(pool, QueuePool)
        assert (pool.size(), pool._max_overflow) == (3, 4)
    assert sibling is not engine


# --- ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["a", "A", "0", "x" * 128, "session-1", "user_1", "a.b:c-d_e", "...", "::", "-"]
)
def test_valid_ids(value: str) -> None:
    assert validate_id(value, "session") == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 129,
        "a b",
        " a",
        "a ",
        "a/b",
        "a\\b",
        "a\n",
        "\na",
        "a\tb",
        "é",
        "\uff53",  # fullwidth s
        "٣",
        "a*b",
        "a@b",
        "a#b",
        "a%b",
        None,
        1,
        1.5,
        b"abc",
        ["a"],
    ],
)
@pytest.mark.parametrize("kind", ["session", "user", "workflow", "step"])
def test_invalid_ids(value: object, kind: str) -> None:
    with pytest.raises(InvalidIdError) as info:
        validate_id(value, kind)
    assert f"invalid {kind} id" in str(info.value)
    assert isinstance(info.value, BadInputError)


def test_invalid_id_message_is_short_for_long_values() -> None:
    with pytest.raises(InvalidIdError) as info:
        validate_id("x" * 10_000, "user")
    assert len(str(info.value)) < 200


# --- Celery configuration -------------------------------------------------------------


@pytest.fixture
def base_settings(clean_env: pytest.MonkeyPatch) -> Settings:
    return Settings()


def test_celery_is_json_only(base_settings: Settings) -> None:
    conf = celery_config(base_settings)
    assert conf["accept_content"] == ["json"]
    assert conf["result_accept_content"] == ["json"]
    assert conf["task_serializer"] == "json"
    assert conf["result_serializer"] == "json"
    assert conf["event_serializer"] == "json"


def test_celery_at_least_once_delivery(base_settings: Settings) -> None:
    conf = celery_config(base_settings)
    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1


@pytest.mark.parametrize("events", [True, False])
def test_celery_events_follow_settings(clean_env: pytest.MonkeyPatch, events: bool) -> None:
    conf = celery_config(Settings(task_events=events))
    assert conf["worker_send_task_events"] is events
    # Flower sees tasks from the workers' events; a "sent" event per enqueue is not worth
    # a second Redis publish on every hop.
    assert conf["task_send_sent_event"] is False


def test_celery_events_from_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTSTATE_TASK_EVENTS", "false")
    assert celery_config(get_settings())["worker_send_task_events"] is False


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"execution_timeout": 5000.0},
        {"lock_timeout": 4000.0},
        {"stuck_after": 2000.0},
    ],
)
def test_celery_visibility_timeout_is_long(
    clean_env: pytest.MonkeyPatch, overrides: dict[str, Any]
) -> None:
    s = Settings(**overrides)
    timeout = celery_config(s)["broker_transport_options"]["visibility_timeout"]
    assert timeout >= 3600
    assert timeout > max(s.execution_timeout, s.lock_timeout, s.stuck_after)


def test_celery_beat_runs_the_recovery_sweep(base_settings: Settings) -> None:
    schedule = celery_config(base_settings)["beat_schedule"]
    tasks = [entry["task"] for entry in schedule.values()]
    assert "agentstate.recovery.sweep" in tasks
    assert all(task.startswith("agentstate.") for task in tasks)


def test_celery_broker_comes_from_settings(clean_env: pytest.MonkeyPatch) -> None:
    s = Settings(redis_url="redis://a:1/0", broker_url="redis://b:2/0")
    assert celery_config(s)["broker_url"] == "redis://b:2/0"


def test_celery_imports_include_action_modules(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENTSTATE_ACTION_MODULES", "my.actions, other.actions")
    s = get_settings()
    imports = celery_config(s)["imports"]
    assert imports[-2:] == ["my.actions", "other.actions"]
    for module in s.action_module_list:
        assert module in imports
    for module in ("tasks.worker.phases", "tasks.worker.steps", "tasks.worker.maintenance"):
        assert module in imports
