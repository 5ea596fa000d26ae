"""The Celery app, configured from Settings."""

from __future__ import annotations

import logging

from celery import Celery
from celery.signals import celeryd_after_setup, worker_process_init

from config import Settings, get_settings
from config.celery import celery_config

logger = logging.getLogger(__name__)


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app for ``settings`` (default: the environment)."""
    application = Celery("agentstate")
    application.config_from_object(celery_config(settings or get_settings()))
    return application


app = make_app()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A prefork child must not share its parent's sockets. Engines and Redis clients
    # are already per-process; this drops the runtime built before the fork, if any.
    from tasks.runtime import reset_runtime

    reset_runtime()


@celeryd_after_setup.connect
def _publish_actions(sender: object = None, **_: object) -> None:
    # Once logging is set up, before the pool forks and before any task is taken:
    # senders validate workflow specs against the actions the workers serve, so an app
    # need not import its action modules.
    from tasks.actions import publish_actions

    publish_actions(str(sender or "unknown"))
