"""The one place that reads the environment (prefix ``AGENTSTATE_``)."""

from __future__ import annotations

import os
from enum import StrEnum
from functools import lru_cache

from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.api_keys import parse_api_keys
from config.urls import (
    absolute_sqlite_url,
    check_broker_url,
    check_database_url,
    check_redis_url,
    check_url,
    read_secret_file,
    redact_url,
)
from state.errors import ConfigurationError

__all__ = [
    "HopPolicy",
    "LogFormat",
    "Settings",
    "child_environment",
    "get_settings",
    "redact_url",
    "settings_error_line",
]


class HopPolicy(StrEnum):
    """How a turn moves from one phase to the next."""

    EVERY_PHASE = "every_phase"
    INLINE = "inline"


class DbPooler(StrEnum):
    """What sits between agentstate and Postgres."""

    NONE = "none"
    # A pooler in transaction mode (PgBouncer's usual setting): a client's consecutive
    # statements may run on different server connections.
    PGBOUNCER = "pgbouncer"


class QueueType(StrEnum):
    """The RabbitMQ queue type agentstate declares (ignored on Redis brokers)."""

    QUORUM = "quorum"
    CLASSIC = "classic"


class LogFormat(StrEnum):
    """How workers (and beat, Flower, ``agentstate serve``) write their log lines."""

    TEXT = "text"
    JSON = "json"


# The OpenTelemetry variables every OTLP exporter reads (read here, as everything is).
OTEL_ALIASES = {
    "otlp_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "otlp_traces_endpoint": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
}


class Settings(BaseSettings):
    """Every knob of agentstate; see the README's configuration table."""

    # No input in validation errors: they would quote URLs, passwords included.
    model_config = SettingsConfigDict(
        env_prefix="AGENTSTATE_",
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,
        populate_by_name=True,
    )

    # URLs may carry passwords: kept out of repr() so that logging Settings leaks none.
    redis_url: str = Field("redis://localhost:6379/0", repr=False)
    broker_url: str = Field("", repr=False)
    # A relative SQLite path (the default's included) is made absolute against the folder
    # the process starts in, here, once: every later use, and every process started with
    # child_environment, names the same file.
    database_url: str = Field("sqlite:///agentstate.db", repr=False, validate_default=True)
    # Files holding those URLs (Docker/Kubernetes secrets), instead of the variables.
    redis_url_file: str = ""
    broker_url_file: str = ""
    database_url_file: str = ""
    db_pooler: DbPooler = DbPooler.NONE
    broker_queue_type: QueueType = QueueType.QUORUM
    lock_timeout: float = Field(30.0, gt=0)
    session_ttl: float = Field(3600.0, gt=0)
    cache_ttl: int = Field(3600, gt=0)
    execution_timeout: float = Field(30.0, gt=0)
    retry_backoff: float = Field(1.0, ge=0)
    agent: str = "tasks.agent"
    action_modules: str = ""
    max_message_bytes: int = Field(65536, gt=0)
    # What one message may make the reference agent do and store.
    max_calculations_per_message: int = Field(20, ge=1)
    max_reply_bytes: int = Field(16384, ge=64)
    max_facts: int = Field(100, ge=1)
    max_fact_bytes: int = Field(2048, ge=1)
    # What one input may cost anyone; past a limit the input is refused, naming it.
    max_user_state_bytes: int = Field(1 << 20, gt=0)
    max_spec_bytes: int = Field(1 << 20, gt=0)
    max_spec_links: int = Field(100_000, ge=0)
    max_step_io_bytes: int = Field(1 << 20, gt=0)
    # Seconds a handler other than executing's may run before its turn is ended.
    phase_time_limit: float = Field(10.0, gt=0)
    stuck_after: float = Field(60.0, gt=0)
    hop_policy: HopPolicy = HopPolicy.EVERY_PHASE
    # A quick phase's message carries the snapshot it continues from (Postgres only):
    # it then reads no cache and takes no lock; its commit checks the snapshot.
    carry_snapshot: bool = True
    # Events: handlers' own events, and how long the event log and revisions are kept.
    # AGENTSTATE_EVENTS=false stops only the push that wakes followers (they then poll
    # slowly); the log itself is always written.
    events: bool = True
    events_retain_days: float = Field(30.0, gt=0)
    max_event_bytes: int = Field(16384, ge=64)
    max_events_per_phase: int = Field(100, ge=1)
    # Bytes (UTF-8) of token chunks one turn may stream to followers (ctx.stream).
    max_stream_bytes: int = Field(1 << 20, ge=64)
    # Human approval: how long a request waits for a decision before beat rejects it.
    approval_ttl: float = Field(86400.0, gt=0)
    # Not in the public surface, but handy for operators and benchmarks.
    task_events: bool = True
    sweep_interval: float = Field(15.0, gt=0)
    max_recoveries: int = Field(3, ge=1)
    auto_migrate: bool = True
    queue: str = "agentstate"
    baseline_tasks: bool = False
    # Per engine, and each process has two (one in autocommit mode): see the README.
    db_pool_size: int = Field(5, ge=1)
    db_max_overflow: int = Field(10, ge=0)
    # Celery: a task past the soft limit gets SoftTimeLimitExceeded, past the hard one its
    # process is killed (the recovery sweep then resumes its turn or step). 0: derived from
    # EXECUTION_TIMEOUT and LOCK_TIMEOUT (at least 360 s hard, 60 s less soft).
    task_soft_time_limit: float = Field(0.0, ge=0)
    task_time_limit: float = Field(0.0, ge=0)
    # KiB of resident memory after which a worker child is replaced (0: never).
    worker_max_memory_per_child: int = Field(512_000, ge=0)
    # The HTTP service (`agentstate serve`): bearer keys ("key:user_id,key2:*"; a secret,
    # kept out of repr()), or the file holding them, and what one request may cost.
    api_keys: str = Field("", repr=False)
    api_keys_file: str = ""
    max_request_bytes: int = Field(2 << 20, gt=0)
    request_time_limit: float = Field(30.0, gt=0)
    # Event streams (Server-Sent Events): a comment this often keeps proxies from closing
    # an idle stream; a stream ends after stream_max_seconds (the browser reconnects with
    # Last-Event-ID); at most max_streams are open at once in one serve process.
    stream_heartbeat: float = Field(15.0, gt=0)
    stream_max_seconds: float = Field(900.0, gt=0)
    max_streams: int = Field(1000, ge=1)
    # Operations: metrics, traces, logs (docs/operations/observability.md).
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port each worker serves Prometheus metrics on (0: off).",
    )
    metrics_addr: str = Field(
        "0.0.0.0",  # noqa: S104 - scraped from other hosts/containers, as exporters are
        description="Address the worker's metrics endpoint binds to.",
    )
    otel: bool = Field(
        False,
        description="Send OpenTelemetry spans (one per phase and step) over OTLP/HTTP.",
    )
    otlp_endpoint: str = Field(
        "",
        validation_alias=AliasChoices(OTEL_ALIASES["otlp_endpoint"]),
        description="OTLP/HTTP base URL (/v1/traces is appended); standard variable.",
    )
    otlp_traces_endpoint: str = Field(
        "",
        validation_alias=AliasChoices(OTEL_ALIASES["otlp_traces_endpoint"]),
        description="OTLP/HTTP traces URL, used as is; standard variable.",
    )
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="Log lines as text (Celery's format) or JSON objects."
    )

    @field_validator("agent", "queue")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("redis_url", "broker_url", "database_url")
    @classmethod
    def _well_formed_url(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "broker_url" and not value:
            return value  # defaults to the Redis URL
        field = str(info.field_name)
        return check_service_url(field, value, f"AGENTSTATE_{field.upper()}")

    @model_validator(mode="after")
    def _resolve_urls_and_limits(self) -> Settings:
        # ConfigurationError, never ValueError, from here: pydantic would quote the input.
        for field in URL_FIELDS:
            path = getattr(self, f"{field}_file")
            if path:
                variable = f"AGENTSTATE_{field.upper()}"
                if field in self.model_fields_set:
                    raise ConfigurationError(f"set {variable} or {variable}_FILE, not both")
                url = read_secret_file(f"{variable}_FILE", path)
                url = check_service_url(field, url, f"the URL in {variable}_FILE ({path})")
                object.__setattr__(self, field, url)
        if not self.broker_url:
            object.__setattr__(self, "broker_url", self.redis_url)
        self._derive_time_limits()
        self._resolve_api_keys()
        return self

    def _resolve_api_keys(self) -> None:
        if self.api_keys_file:
            if self.api_keys:  # empty is unset
                raise ConfigurationError(
                    "set AGENTSTATE_API_KEYS or AGENTSTATE_API_KEYS_FILE, not both"
                )
            keys = read_secret_file("AGENTSTATE_API_KEYS_FILE", self.api_keys_file)
            object.__setattr__(self, "api_keys", keys)
        parse_api_keys(self.api_keys)  # refused at start, naming the variable

    @property
    def api_key_users(self) -> dict[str, str]:
        """``{key: user_id}`` of AGENTSTATE_API_KEYS (``"*"``: an operator key); empty
        when no key is set (then ``agentstate serve`` listens on loopback only)."""
        return parse_api_keys(self.api_keys)

    def _derive_time_limits(self) -> None:
        longest = max(self.execution_timeout, self.lock_timeout)
        hard = self.task_time_limit or max(MIN_TIME_LIMIT_S, longest + 2 * TIME_LIMIT_GRACE_S)
        soft = self.task_soft_time_limit or max(hard - TIME_LIMIT_GRACE_S, hard * 0.8)
        if hard <= longest:
            raise ConfigurationError(
                "AGENTSTATE_TASK_TIME_LIMIT must be above AGENTSTATE_EXECUTION_TIMEOUT and "
                "AGENTSTATE_LOCK_TIMEOUT (a task killed sooner could never finish its phase)"
            )
        if soft >= hard:
            raise ConfigurationError(
                "AGENTSTATE_TASK_SOFT_TIME_LIMIT must be below AGENTSTATE_TASK_TIME_LIMIT"
            )
        object.__setattr__(self, "task_time_limit", hard)
        object.__setattr__(self, "task_soft_time_limit", soft)

    @property
    def otlp_traces_url(self) -> str:
        """Where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, else
        OTEL_EXPORTER_OTLP_ENDPOINT + ``/v1/traces``, else the collector's default port
        on this host (the OTLP specification's defaults)."""
        if self.otlp_traces_endpoint:
            return self.otlp_traces_endpoint
        base = self.otlp_endpoint or "http://localhost:4318"
        return base.rstrip("/") + "/v1/traces"

    @field_validator("otlp_endpoint", "otlp_traces_endpoint")
    @classmethod
    def _http_url(cls, value: str, info: ValidationInfo) -> str:
        if value and not value.startswith(("http://", "https://")):
            variable = OTEL_ALIASES[str(info.field_name)]
            raise ConfigurationError(f"{variable} must be an http:// or https:// URL")
        return value

    @property
    def action_module_list(self) -> list[str]:
        """The modules named by ``AGENTSTATE_ACTION_MODULES``, in order."""
        return [name.strip() for name in self.action_modules.split(",") if name.strip()]

    @property
    def visibility_timeout_s(self) -> int:
        """Broker redelivery delay: well above the longest task we run."""
        longest = max(
            self.execution_timeout, self.lock_timeout, self.stuck_after, self.task_time_limit
        )
        return int(max(3600.0, longest * 4))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide Settings (``get_settings.cache_clear()`` to re-read)."""
    return Settings()


URL_FIELDS = ("redis_url", "broker_url", "database_url")
# Values that may come from a file (FIELD_file) and then never travel in the environment.
SECRET_FIELDS = (*URL_FIELDS, "api_keys")
MIN_TIME_LIMIT_S = 360.0
TIME_LIMIT_GRACE_S = 60.0


def check_service_url(field: str, url: str, variable: str) -> str:
    """``url`` if it is a well-formed value for ``field``; else ConfigurationError naming
    ``variable`` and quoting nothing of the URL."""
    check_url(variable, url, alternatives=field == "broker_url")
    if field == "database_url":
        from sqlalchemy.engine import make_url

        try:
            make_url(url)
        except Exception:
            raise ConfigurationError(
                f"{variable} is not a valid SQLAlchemy URL "
                "(dialect+driver://user:password@host:port/database)"
            ) from None
    try:
        SUPPORTED_CHECKS[field](url)
    except ValueError as exc:
        raise ConfigurationError(f"{variable}: {exc}") from None
    return absolute_sqlite_url(url) if field == "database_url" else url


SUPPORTED_CHECKS = {
    "database_url": check_database_url,
    "redis_url": check_redis_url,
    "broker_url": check_broker_url,
}


def settings_error_line(exc: ValidationError) -> str:
    """One line naming each AGENTSTATE_* variable a ValidationError is about (values are
    left out: they may be URLs with passwords)."""
    parts = []
    for error in exc.errors():
        names = [str(part) for part in error.get("loc", ())]
        where = f"AGENTSTATE_{names[0].upper()}" if names else "AGENTSTATE_* settings"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "bad setting " + "; ".join(parts)


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment, with AGENTSTATE_* replaced by ``settings`` exactly (for
    the worker processes the demo, tests and benchmarks start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    values = settings.model_dump()
    for field in SECRET_FIELDS:
        if values[f"{field}_file"]:
            del values[field]  # the child reads the same file (and the secret stays off env)
    if settings.redis_url_file and not settings.broker_url_file:
        values.pop("broker_url", None)  # it defaulted to the Redis URL: it will again
    for name, value in values.items():
        if name in OTEL_ALIASES:
            if value:
                env[OTEL_ALIASES[name]] = str(value)
            continue
        env[f"AGENTSTATE_{name.upper()}"] = str(getattr(value, "value", value))
    return env
