"""What a Celery process checks before it serves: its settings, action modules and agent.

A bad AGENTSTATE_* value stops ``celery -A tasks worker|beat|flower`` with one line naming
the variable (as the ``agentstate`` command reports it), wherever Celery first reads its
configuration: often while it parses its own options, long before any start signal.

A worker that cannot import its agent would accept every phase and fail each one, leaving
the messages to the recovery sweep; it refuses to start instead, with one line on stderr
and exit status 2. Both imports run with the current folder on ``sys.path``, exactly as
Celery imports the modules in ``imports`` (``celery.utils.imports.cwd_in_path``), so
``celery -A tasks worker`` run next to an app's agent module finds it. A prefork worker
imports them once, before it forks its pool, and its children inherit them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from celery.signals import celeryd_after_setup, celeryd_init, import_modules
from celery.utils.imports import cwd_in_path
from pydantic import ValidationError

from config import Settings, get_settings, redact_url, settings_error_line
from state.errors import AgentStateError, ConfigurationError

EXIT_BAD_CONFIG = 2
logger = logging.getLogger(__name__)


def settings_or_exit() -> Settings:
    """``get_settings()``; in a Celery program a bad setting is one line and exit 2. Any
    other process (an app, the ``agentstate`` command) gets the error raised, to report
    it its own way."""
    try:
        return get_settings()
    except (ValidationError, ConfigurationError) as exc:
        if not _in_celery_program():
            raise
        _exit(settings_error_line(exc) if isinstance(exc, ValidationError) else str(exc))


def _in_celery_program() -> bool:
    # The `celery` command is a click program: its options, and the commands it runs
    # (worker, beat, Flower), run inside its click context.
    import click

    context = click.get_current_context(silent=True)
    return context is not None and context.find_root().info_name == "celery"


def check_action_modules() -> None:
    """Import the modules named by AGENTSTATE_ACTION_MODULES (current folder importable)."""
    from tasks.actions import import_action_modules

    with cwd_in_path():
        import_action_modules(get_settings().action_module_list)


def check_agent() -> None:
    """Import the agent named by AGENTSTATE_AGENT (current folder importable)."""
    from state.agent import load_agent
    from tasks.actions import describe_failure

    settings = get_settings()
    dotted = settings.agent
    with cwd_in_path():
        try:
            load_agent(dotted)
        except AgentStateError as exc:
            raise AgentStateError(f"{exc} (AGENTSTATE_AGENT)") from exc
        except Exception as exc:
            raise AgentStateError(
                f"cannot import agent {dotted!r} (AGENTSTATE_AGENT): {describe_failure(exc)}"
            ) from exc
        if settings.agents.strip() or settings.langgraph_config:
            _check_named_agents(settings)


def _check_named_agents(settings: Settings) -> None:
    """Import and check the agents of AGENTSTATE_AGENTS (their frameworks too)."""
    from tasks.actions import describe_failure
    from tasks.agents.registry import registry

    try:
        registry(settings)
    except AgentStateError as exc:
        raise AgentStateError(f"{exc} (AGENTSTATE_AGENTS)") from exc
    except Exception as exc:
        raise AgentStateError(f"cannot load AGENTSTATE_AGENTS: {describe_failure(exc)}") from exc


def _or_exit(check: Callable[[], None]) -> None:
    # Celery logs and ignores what a signal handler raises, so the refusal is an exit.
    try:
        check()
    except ValidationError as exc:
        _exit(settings_error_line(exc))
    except AgentStateError as exc:
        _exit(str(exc))


def exit_naming(variable: str, message: str) -> NoReturn:
    """Stop a Celery program at start with one line naming ``variable`` (exit 2)."""
    _exit(f"{variable}: {message}")


def _exit(message: str) -> NoReturn:
    line = " ".join(redact_url(message).split())
    print(f"agentstate: error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_CONFIG)


@import_modules.connect
def _before_task_modules(**_: Any) -> None:
    # Sent by every Celery program that imports the task modules (worker, beat, Flower)
    # right before it imports ``imports``, where a bad action module would be a traceback.
    _or_exit(check_action_modules)


@celeryd_init.connect
def _before_worker(**_: Any) -> None:
    # The first signal of `celery worker`: before its banner and before any task runs.
    _or_exit(check_agent)


@celeryd_after_setup.connect
def _database_at_start(instance: Any = None, **_: Any) -> None:
    # Once logging is set up and before the pool forks: the banner names the database
    # (a SQLite path made absolute), and apps on this queue learn which database it is.
    settings = get_settings()
    where = redact_url(settings.database_url)
    try:
        publish_database(settings)
    except Exception as exc:  # a worker serves all the same; apps just cannot compare
        first_line = (redact_url(str(exc)).splitlines() or [type(exc).__name__])[0]
        logger.warning("could not publish this worker's database: %s", first_line)
    if instance is not None:
        banner_extra = instance.extra_info
        line = f"[agentstate]\n  .> database:  {where}\n  .> agent:     {settings.agent}\n"
        instance.extra_info = lambda: line + (banner_extra() or "")


def publish_database(settings: Settings) -> None:
    """Record in Redis, for apps on this worker's queue, which database it uses."""
    from state.storage.db import get_engine
    from state.storage.identity import database_identity, publish_workers_database
    from state.storage.redis_client import get_redis

    engine = get_engine(settings.database_url, auto_migrate=settings.auto_migrate)
    try:
        identity = database_identity(engine)
    finally:
        engine.dispose()  # the main process runs no task: hand no socket to the children
    publish_workers_database(get_redis(settings.redis_url), settings.queue, identity)
