"""The Celery app, configured from Settings."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    celeryd_init,
    worker_process_init,
    worker_shutdown,
)

from config import Settings
from config.celery import celery_config
from config.urls import hide_secrets_in
from tasks.worker.forksafe import track_app

logger = logging.getLogger(__name__)


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app for ``settings`` (default: the environment, read on first use)."""
    application = Celery("agentstate", amqp="tasks.dispatch.transport:AMQP")
    if settings is None:
        # Read when the configuration is first needed, not while `tasks` is imported: a
        # bad AGENTSTATE_* value then surfaces where it is reported as one line (the CLI;
        # in `celery -A tasks ...`, settings_or_exit) instead of as a traceback.
        application.add_defaults(_configuration)
    else:
        application.config_from_object(celery_config(settings))
    return track_app(application)


def _configuration() -> dict[str, Any]:
    from tasks.worker.startup import settings_or_exit

    return celery_config(settings_or_exit())


app = make_app()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A prefork child must not share its parent's sockets. Engines and Redis clients
    # are already per-process; this drops the runtime built before the fork, if any.
    from tasks.worker.runtime import reset_runtime

    reset_runtime()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _hide_secrets(logger: logging.Logger, **_: object) -> None:
    # Whatever a library puts in a worker's, beat's or Flower's log, no password stays.
    from config.settings import LogFormat
    from tasks.worker.startup import settings_or_exit

    if settings_or_exit().log_format == LogFormat.JSON:
        from tasks.observability.logs import use_json

        use_json(logger)
    hide_secrets_in(logger)


@celeryd_init.connect
def _metrics_endpoint(**_: object) -> None:
    # In the worker's main process, before its pool forks: the children count into the
    # directory this sets up, and this process serves the sum (it runs no task itself).
    from tasks.observability.metrics import start_worker_endpoint
    from tasks.worker.startup import exit_naming, settings_or_exit

    settings = settings_or_exit()
    try:
        _metrics_dir.append(start_worker_endpoint(settings))
    except OSError as exc:
        exit_naming(
            "AGENTSTATE_METRICS_PORT",
            f"cannot serve metrics on {settings.metrics_addr}:{settings.metrics_port}: "
            f"{exc.strerror or exc}",
        )


@worker_shutdown.connect
def _metrics_files(**_: object) -> None:
    from tasks.observability.metrics import stop_worker_endpoint

    for path in _metrics_dir:
        stop_worker_endpoint(path)


_metrics_dir: list[str | None] = []


@celeryd_after_setup.connect
def _publish_actions(sender: object = None, **_: object) -> None:
    # Once logging is set up, before the pool forks and before any task is taken:
    # senders validate workflow specs against the actions the workers serve, so an app
    # need not import its action modules.
    from tasks.actions import publish_actions

    publish_actions(str(sender or "unknown"))


# The start checks (settings, action modules, agent) connect to Celery's start signals,
# and a worker tells the fleet its children (the fleet-wide cap of claimed steps).
from tasks.worker import fleet, housebeat, startup  # noqa: E402,F401
