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

from config.agents import langgraph_graphs, parse_agents
from config.api_keys import parse_api_keys
from config.urls import (
    absolute_sqlite_url,
    check_broker_url,
    check_database_url,
    check_redis_url,
    check_url,
    normalise_database_url,
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
    """Every knob of agentstate (docs/reference/settings.md lists them, from here)."""

    # No input in validation errors: they would quote URLs, passwords included. Each
    # field's docstring is its description, which the docs' settings page shows.
    model_config = SettingsConfigDict(
        env_prefix="AGENTSTATE_",
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
        populate_by_name=True,
    )

    # URLs may carry passwords: kept out of repr() so that logging Settings leaks none.
    redis_url: str = Field("redis://localhost:6379/0", repr=False)
    """Locks and cache (passwords and ACL users go in the URL, percent-escaped);
    `redis+sentinel://...` for Sentinel."""
    broker_url: str = Field("", repr=False)
    """Celery broker: `redis://`, `redis+sentinel://` or `amqp://` (RabbitMQ); unset, the Redis
    URL."""
    # A relative SQLite path (the default's included) is made absolute against the folder
    # the process starts in, here, once: every later use, and every process started with
    # child_environment, names the same file.
    database_url: str = Field("sqlite:///agentstate.db", repr=False, validate_default=True)
    """The authority; Postgres in production (`postgres://...`, `postgresql://...` and
    `postgresql+psycopg2://...` all mean psycopg2); other databases and drivers are refused.
    A relative SQLite path (the default's) is made absolute against the folder the process
    starts in; workers show it in their banner."""
    # Files holding those URLs (Docker/Kubernetes secrets), instead of the variables.
    redis_url_file: str = ""
    """Read `AGENTSTATE_REDIS_URL` from a file (a Docker or Kubernetes secret); setting both is an
    error."""
    broker_url_file: str = ""
    """The same for `AGENTSTATE_BROKER_URL`."""
    database_url_file: str = ""
    """The same for `AGENTSTATE_DATABASE_URL`."""
    db_pooler: DbPooler = DbPooler.NONE
    """`pgbouncer`: a pooler in transaction mode is in front of Postgres (statements go
    unprepared). Forgotten, a process notices the pooler by its prepared-statement errors, goes
    on unprepared and warns once naming this setting."""
    broker_queue_type: QueueType = QueueType.QUORUM
    """RabbitMQ only: `quorum` or `classic`."""
    lock_timeout: float = Field(30.0, gt=0)
    """Lock TTL in seconds (renewed while held)."""
    session_ttl: float = Field(3600.0, gt=0)
    """Seconds idle before beat marks a session timed out."""
    cache_ttl: int = Field(3600, gt=0)
    """Seconds a cache entry lives."""
    execution_timeout: float = Field(30.0, gt=0)
    """Seconds the `executing` phase may take (a durable deadline)."""
    retry_backoff: float = Field(1.0, ge=0)
    """Base of a workflow step's exponential retry delay, seconds."""
    agent: str = "tasks.agent"
    """Dotted path of the phase handlers."""
    agents: str = ""
    """Agents beside the default one: comma-separated `name=dotted.path[:attribute]` (phase
    handlers, a compiled LangGraph graph, ...); a session's first message picks one by name."""
    langgraph_config: str = ""
    """Path of a `langgraph.json` whose `graphs` are agents too, beside AGENTSTATE_AGENTS (a
    LangGraph project moves over with its config file as it is)."""
    framework_turn_timeout: float = Field(600.0, gt=0)
    """Seconds a turn of a framework agent (a LangGraph graph, ...) may run in `executing`."""
    action_modules: str = ""
    """Comma-separated modules that register workflow actions; workers import them at start and
    publish the names they serve."""
    max_message_bytes: int = Field(65536, gt=0)
    """Largest accepted message."""
    # What one message may make the reference agent do and store.
    max_calculations_per_message: int = Field(20, ge=1)
    """Reference agent: a message with more expressions computes none and says so."""
    max_reply_bytes: int = Field(16384, ge=64)
    """Reference agent: longer replies are cut, ending in an ellipsis."""
    max_facts: int = Field(100, ge=1)
    """Reference agent: memories kept per user; one more forgets the oldest."""
    max_fact_bytes: int = Field(2048, ge=1)
    """Reference agent: a longer \"remember that ...\" is refused with a reply."""
    # What one input may cost anyone; past a limit the input is refused, naming it.
    max_user_state_bytes: int = Field(1 << 20, gt=0)
    """Largest user state, as JSON."""
    max_spec_bytes: int = Field(1 << 20, gt=0)
    """Largest workflow spec, as JSON."""
    max_spec_links: int = Field(100_000, ge=0)
    """Most dependency links in one workflow spec."""
    max_step_io_bytes: int = Field(1 << 20, gt=0)
    """Largest inputs, and largest outputs, of one workflow step."""
    # Seconds a handler other than executing's may run before its turn is ended.
    phase_time_limit: float = Field(10.0, gt=0)
    """Seconds a handler other than `executing`'s may run."""
    stuck_after: float = Field(60.0, gt=0)
    """Seconds without progress before the sweep resumes work; set it above the longest time a
    message may wait in the queue."""
    hop_policy: HopPolicy = HopPolicy.EVERY_PHASE
    """`every_phase`: each phase goes through the broker; `inline`: a `@quick` phase continues into
    the next in the same worker process (one durable checkpoint per phase still)."""
    # A quick phase's message carries the snapshot it continues from (Postgres only):
    # it then reads no cache and takes no lock; its commit checks the snapshot.
    carry_snapshot: bool = True
    """Postgres: a quick phase's (or released step's) task message carries the snapshot it
    continues from (up to 32 KiB of JSON), so it reads no cache and takes no lock; its commit
    lands only if the row holds exactly that snapshot (`false`: every phase locks and reads the
    cache)."""
    # Events: handlers' own events, and how long the event log and revisions are kept.
    # AGENTSTATE_EVENTS=false stops only the push that wakes followers (they then poll
    # slowly); the log itself is always written.
    events: bool = True
    """Push each commit to the session's followers through Redis (`false`: waits and followers
    poll; the event log is written either way)."""
    events_retain_days: float = Field(30.0, gt=0)
    """Days events and revision records are kept (beat prunes older ones; a session's current state
    is kept)."""
    sessions_retain_days: float | None = Field(
        None,
        gt=0,
        description="Days a resting session may stay untouched before retention deletes it "
        "with everything of it (history, inbox, events, revisions, its workflows and "
        "approvals); fractions allowed; unset: sessions are kept.",
    )
    workflows_retain_days: float | None = Field(
        None,
        gt=0,
        description="Days a finished workflow is kept (with its steps and its decided "
        "approvals) before retention deletes it; fractions allowed; unset: kept.",
    )
    maintenance_pace: float = Field(0.5, ge=0, le=10)
    """After each batch of retention or erasure, a pause of this many times the batch's own time
    (`0`: none): a long prune or erasure then leaves the database room for everyone's turns."""
    max_event_bytes: int = Field(16384, ge=64)
    """Largest `data` of an event a handler emits."""
    max_events_per_phase: int = Field(100, ge=1)
    """Events one phase of a handler may emit."""
    # Bytes (UTF-8) of token chunks one turn may stream to followers (ctx.stream).
    max_stream_bytes: int = Field(1 << 20, ge=64)
    """Bytes of chunks one turn may stream with `ctx.stream`."""
    # Human approval: how long a request waits for a decision before beat rejects it.
    approval_ttl: float = Field(86400.0, gt=0)
    """Seconds an approval waits for a decision before beat rejects it (`by == \"expired\"`); a
    handler may give its own `ttl_s`."""
    # Tenancy quotas: what one user may leave waiting (refused past it, nothing stored).
    max_queued_messages: int = Field(
        100,
        ge=1,
        description="Messages that may wait in one session's inbox (behind its running "
        "turn); the next send_message is refused with a bad-input error naming "
        "AGENTSTATE_MAX_QUEUED_MESSAGES, nothing stored.",
    )
    max_queued_messages_per_user: int = Field(
        1000,
        ge=1,
        description="Messages that may wait across all of one user's sessions (beside the "
        "per-session AGENTSTATE_MAX_QUEUED_MESSAGES); the next send_message is refused with "
        "a bad-input error naming AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER, nothing stored.",
    )
    max_pending_approvals: int = Field(
        100,
        ge=1,
        description="Undecided, unexpired approval requests one user may have; a workflow "
        "start or retry that would ask for more is refused with a bad-input error naming "
        "AGENTSTATE_MAX_PENDING_APPROVALS, nothing stored.",
    )
    # Not in the public surface, but handy for operators and benchmarks.
    task_events: bool = True
    """Celery task events (what Flower shows)."""
    sweep_interval: float = Field(15.0, gt=0)
    """Seconds between recovery sweeps (sent by the workers, or by beat)."""
    worker_beat: bool = True
    """Workers send the periodic tasks themselves (the recovery sweep, expiries, schedule ticks
    and webhook deliveries, retention), one worker of the fleet per period, so workers alone
    keep every liveness promise; `celery beat` stays supported beside them (each task is
    safe to run twice). `false`: only a beat sends them."""
    max_recoveries: int = Field(3, ge=1)
    """Recoveries of one turn or step (its worker lost, by the sweep or the broker's redelivery)
    before it is given up."""
    auto_migrate: bool = True
    """Upgrade the schema on first use."""
    queue: str = "agentstate"
    """The Celery queue of turns and the other tasks; workflow steps go to `<queue>.steps`,
    which a plain worker consumes after it (docs: operations/fair-share)."""
    user_step_concurrency: int = Field(
        2,
        ge=0,
        description=(
            "Workflow steps (not quick) of one user running at once; that user's other "
            "ready steps wait in the database and are released as these finish (0: no "
            "cap). Workflows of no owner (operator code) share one more such cap. A "
            "workflow's quick roots beyond 64 times this are held the same way, one "
            "handed over per finished step of the user."
        ),
    )
    children_for_turns: int = Field(
        1,
        ge=0,
        description=(
            "Worker children, across every live worker of the queue, that workflow steps "
            "(not quick) never take, whoever runs them: at most (all live children - "
            "this, at least 1) such steps run at once, the others wait in the database "
            "and are released as running ones finish, so a turn always finds a child. "
            "0: steps may take every child (docs: operations/fair-share)."
        ),
    )
    baseline_tasks: bool = False
    """Load the bare baseline tasks benchmarks measure against."""
    # Per engine, and each process has two (one in autocommit mode).
    db_pool_size: int = Field(5, ge=1)
    """Connections each database engine keeps (a process has two engines)."""
    db_max_overflow: int = Field(10, ge=0)
    """Connections an engine may open beyond its pool under load."""
    # Celery: a task past the soft limit gets SoftTimeLimitExceeded, past the hard one its
    # process is killed (the recovery sweep then resumes its turn or step). 0: derived from
    # EXECUTION_TIMEOUT and LOCK_TIMEOUT (at least 360 s hard, 60 s less soft).
    task_soft_time_limit: float = Field(0.0, ge=0)
    """Seconds before a running task gets `SoftTimeLimitExceeded` (default: 60 below the hard
    limit, at least 80% of it)."""
    task_time_limit: float = Field(0.0, ge=0)
    """Seconds before a task's worker process is killed and replaced; the sweep resumes its work
    (default: 360, or 120 above the longer of the execution timeout and the lock timeout; must
    exceed both)."""
    # KiB of resident memory after which a worker child is replaced (0: never).
    worker_max_memory_per_child: int = Field(512_000, ge=0)
    """KiB of resident memory after which a worker child is replaced (`0`: never)."""
    # The HTTP service (`agentstate serve`): bearer keys ("key:user_id,key2:*"; a secret,
    # kept out of repr()), or the file holding them, and what one request may cost.
    api_keys: str = Field("", repr=False)
    """`agentstate serve`'s bearer keys, `key:user_id` pairs separated by commas (`key:*`: an
    operator); a secret, never logged; without it the service listens on loopback only and every
    caller is the operator."""
    api_keys_file: str = ""
    """Read `AGENTSTATE_API_KEYS` from a file (one pair per line); setting both is an error."""
    max_request_bytes: int = Field(2 << 20, gt=0)
    """Largest HTTP request body."""
    request_time_limit: float = Field(30.0, gt=0)
    """Seconds an HTTP request may take before its answer begins."""
    # Event streams (Server-Sent Events): a comment this often keeps proxies from closing
    # an idle stream; a stream ends after stream_max_seconds (the browser reconnects with
    # Last-Event-ID); at most max_streams are open at once in one serve process.
    stream_heartbeat: float = Field(15.0, gt=0)
    """Seconds between comments on an idle event stream (SSE)."""
    stream_max_seconds: float = Field(900.0, gt=0)
    """The longest an event stream stays open (clients resume with `Last-Event-ID`)."""
    max_streams: int = Field(1000, ge=1)
    """Event streams one `agentstate serve` process holds at once."""
    max_streams_per_key: int = Field(20, ge=1)
    """Event streams one API key (or, without keys, one caller) holds open at once in one
    `agentstate serve` process, beside `AGENTSTATE_MAX_STREAMS`."""
    http_header_timeout: float = Field(10.0, gt=0)
    """Seconds a connection may take to send a request's headers before `agentstate serve`
    closes it (a client that opens connections and never finishes them holds nothing)."""
    http_max_connections: int = Field(2048, ge=1)
    """Connections (and requests in flight) `agentstate serve` holds at once; past it a
    request answers 503."""
    http_bad_key_limit: int = Field(100, ge=1)
    """Wrong API keys one client address may present in a minute; past it every request of
    that address answers 429 with `Retry-After` until the minute is over."""
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
    # Schedules and webhooks (docs/guides/schedules.md, docs/guides/webhooks.md).
    tick_interval: float = Field(1.0, gt=0, le=60)
    """Seconds between beat's looks for due schedule ticks and webhook deliveries (each look is
    one indexed read when nothing is due)."""
    schedule_grace: float = Field(60.0, gt=0)
    """Seconds late a tick may fire under `catch_up="none"`; a tick later than that (beat was down)
    is missed, not fired."""
    max_schedules_per_user: int = Field(100, ge=1)
    """Schedules one user may have; one more is refused, naming this setting, nothing stored."""
    max_webhooks_per_user: int = Field(20, ge=1)
    """Webhooks one user may register; one more is refused, naming this setting."""
    webhook_max_attempts: int = Field(8, ge=1, le=100)
    """Attempts of one webhook delivery before it is given up (`failed`); `redeliver` starts
    again."""
    webhook_retry_base_seconds: float = Field(10.0, gt=0)
    """Attempt n of a delivery that failed waits this x 2^(n-1) seconds before the next one, at
    most an hour."""
    webhook_timeout: float = Field(10.0, gt=0, le=300)
    """Seconds one delivery attempt may take (connect, send, answer); longer is a failed attempt."""
    webhook_allow_private: bool = False
    """Allow webhook URLs that resolve to loopback, private or link-local addresses (checked when
    a hook is added and again at every send, on the address connected to)."""
    public_url: str = ""
    """The server's public base URL (``https://agents.example.com``): the A2A agent cards name
    their endpoint under it. Empty: the host the card was asked from (fine unless a proxy
    rewrites it)."""

    @property
    def step_queue(self) -> str:
        """The broker queue of workflow steps: turns have a queue of their own, so that
        they never wait behind steps; a plain worker consumes both, turns first (sorted:
        this name sorts after the turns' queue's)."""
        return f"{self.queue}{STEP_QUEUE_SUFFIX}"

    @field_validator("agent", "queue")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("sessions_retain_days", "workflows_retain_days", mode="before")
    @classmethod
    def _off_when_blank(cls, value: object) -> object:
        # An empty variable (AGENTSTATE_SESSIONS_RETAIN_DAYS=) turns retention off.
        return None if isinstance(value, str) and not value.strip() else value

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
        self._check_agents()  # refused at start, naming the variable
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

    @property
    def agent_targets(self) -> dict[str, str]:
        """``{name: dotted.path[:attribute]}`` of AGENTSTATE_AGENTS, in order, then the
        graphs of AGENTSTATE_LANGGRAPH_CONFIG."""
        return {**parse_agents(self.agents), **langgraph_graphs(self.langgraph_config)}

    def _check_agents(self) -> None:
        named = parse_agents(self.agents)
        both = sorted(set(named) & set(langgraph_graphs(self.langgraph_config)))
        if both:
            raise ConfigurationError(
                f"AGENTSTATE_AGENTS and AGENTSTATE_LANGGRAPH_CONFIG both name {both[0]!r}"
            )

    @property
    def turn_timeout_longest(self) -> float:
        """The longest a turn may stay in ``executing``: a framework agent's time limit
        counts once AGENTSTATE_AGENTS names any agent (it may be one)."""
        named = self.agents.strip() or self.langgraph_config
        framework = self.framework_turn_timeout if named else 0.0
        return max(self.execution_timeout, framework)

    def _derive_time_limits(self) -> None:
        longest = max(self.turn_timeout_longest, self.lock_timeout)
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

    @field_validator("otlp_endpoint", "otlp_traces_endpoint", "public_url")
    @classmethod
    def _http_url(cls, value: str, info: ValidationInfo) -> str:
        if value and not value.startswith(("http://", "https://")):
            name = str(info.field_name)
            variable = OTEL_ALIASES.get(name, f"AGENTSTATE_{name.upper()}")
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
            self.turn_timeout_longest, self.lock_timeout, self.stuck_after, self.task_time_limit
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
STEP_QUEUE_SUFFIX = ".steps"
TIME_LIMIT_GRACE_S = 60.0


def check_service_url(field: str, url: str, variable: str) -> str:
    """``url`` if it is a well-formed value for ``field``; else ConfigurationError naming
    ``variable`` and quoting nothing of the URL."""
    check_url(variable, url, alternatives=field == "broker_url")
    if field == "database_url":
        url = normalise_database_url(url)
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


def variable_of(field: str) -> str:
    """The environment variable of Settings field ``field`` (``AGENTSTATE_<FIELD>``, or the
    standard OpenTelemetry variable an OTLP field reads)."""
    return OTEL_ALIASES.get(field, f"AGENTSTATE_{field.upper()}")


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
        # An unset optional setting stays unset (empty), not the text "None".
        shown = "" if value is None else str(getattr(value, "value", value))
        env[f"AGENTSTATE_{name.upper()}"] = shown
    return env
