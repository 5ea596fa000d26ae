"""The Celery app, configured from Settings."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from functools import cached_property
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger, worker_process_init

from config import Settings, get_settings
from config.celery import celery_config
from config.urls import hide_secrets_in
from tasks.forksafe import track_app

logger = logging.getLogger(__name__)


class _ConfigFromEnvironment(Mapping[str, Any]):
    """The environment's Celery settings, computed when Celery first reads them: importing
    ``tasks`` never fails on a bad AGENTSTATE_* value, so the CLI reports it in one line."""

    @cached_property
    def _values(self) -> dict[str, Any]:
        return celery_config(get_settings())

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app for ``settings`` (default: the environment, read on first use)."""
    application = Celery("agentstate")
    source = _ConfigFromEnvironment() if settings is None else celery_config(settings)
    application.config_from_object(source)
    return track_app(application)


app = make_app()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A prefork child must not share its parent's sockets. Engines and Redis clients
    # are already per-process; this drops the runtime built before the fork, if any.
    from tasks.runtime import reset_runtime

    reset_runtime()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _hide_secrets(logger: logging.Logger, **_: object) -> None:
    # Whatever a library puts in a worker's, beat's or Flower's log, no password stays.
    hide_secrets_in(logger)
