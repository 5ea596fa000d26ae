"""AGENTSTATE_LOG_FORMAT=json: one JSON object per log line (time, level, logger,
message, the task's name and id inside a task, and the traceback of an exception), for
log pipelines that parse instead of grep."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        task = _current_task()
        if task is not None:
            line["task_name"], line["task_id"] = task
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return orjson.dumps(line, default=str).decode()


def _current_task() -> tuple[str, str] | None:
    from celery import current_task

    task = current_task
    if not task or task.request.id is None:
        return None
    return str(task.name), str(task.request.id)


def use_json(logger: logging.Logger) -> None:
    """Make every handler of ``logger`` write JSON lines."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())
