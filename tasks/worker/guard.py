"""Malformed task messages are refused on one log line; the worker keeps serving.

Celery's worker trusts what it takes off the broker: a body that is not ``[args, kwargs,
embed]``, a header of the wrong type or a task name that is not a string raises inside
the consumer and stops the worker; the message, never acknowledged, then stops the next
worker too, forever. Here each message is checked first (body shape, the headers Celery
reads, arguments against the task's signature, ids by ``validate_id``); a malformed one
is logged once and rejected without requeue. The checks are pure and cost at most
O(size of the message), never O(its depth). Two hooks apply them: ``strategy``, the
``Task.Strategy`` of agentstate's tasks, and ``Consumer`` (``worker_consumer``), which
refuses task names Celery cannot look up and guards Celery's own built-in tasks. The
header rules live in ``tasks.worker.guard_headers``.
"""

from __future__ import annotations

import inspect
import logging
import math
import types
import typing
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from celery import signals
from celery.app.task import Task
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.strategy import default as default_strategy
from kombu.exceptions import DecodeError

from state.errors import InvalidIdError, MalformedTaskMessageError
from state.ids import validate_id
from state.sessions.snapshot import CARRY_MAX_CHARS
from tasks.worker.guard_headers import MAX_INT, TASK_ID, check_fields, one_line, shown

logger = logging.getLogger(__name__)

# What a linked message carries. agentstate never chains, chords or links its tasks, so
# one of its messages that asks for that is forged; other tasks get a shape check.
LINKS: dict[str, type] = {"callbacks": list, "errbacks": list, "chain": list, "chord": dict}
# Arguments that are ids of these kinds, wherever a task takes them.
# The dotted path of :func:`strategy`, as Celery's ``Task.Strategy`` attribute takes it.
GUARD_STRATEGY = "tasks.worker.guard:strategy"

ID_ARGUMENTS = {
    "session_id": "session",
    "user_id": "user",
    "workflow_id": "workflow",
    "step_id": "step",
}
# Arguments whose text is bounded, wherever a task takes them: the snapshot a phase
# message carries is never sent bigger, so a bigger one is forged.
BOUNDED_ARGUMENTS = {"carried": CARRY_MAX_CHARS}
_P = inspect.Parameter


# -- the body ----------------------------------------------------------------------


@dataclass(frozen=True)
class TaskMessage:
    """A decoded message split the way Celery's worker will split it."""

    fields: Mapping[str, Any]  # headers (protocol 2) or the body's own fields (protocol 1)
    args: object
    kwargs: object
    links: Mapping[str, object]


def unpack(headers: Mapping[str, Any], payload: object, *, named_in_headers: bool) -> TaskMessage:
    """Split ``payload`` as Celery does: protocol 2 (``[args, kwargs, embed]`` under task
    headers), protocol 1 (an object with the task's name, id and arguments) or the hybrid
    (an object with ``args`` under task headers, whose headers win)."""
    if isinstance(payload, dict) and ("args" in payload or not named_in_headers):
        fields = ChainMap(dict(headers), payload) if "args" in payload else payload
        links = {name: payload.get(name) for name in LINKS}
        return TaskMessage(fields, payload.get("args", []), payload.get("kwargs", {}), links)
    if not isinstance(payload, list | tuple) or len(payload) != 3:
        raise MalformedTaskMessageError(f"body must be [args, kwargs, embed]; got {shown(payload)}")
    args, kwargs, embed = payload
    if not isinstance(embed, dict):
        raise MalformedTaskMessageError(f"embed must be an object; got {shown(embed)}")
    return TaskMessage(headers, args, kwargs, embed)


def check_links(links: Mapping[str, object], *, linkable: bool) -> None:
    """Refuse callbacks, errbacks, chains and chords for a task that is never linked, and
    links of the wrong shape for one that may be."""
    for name, shape in LINKS.items():
        value = links.get(name)
        if value and not linkable:
            raise MalformedTaskMessageError(
                f"agentstate tasks are never linked; got {name} {shown(value)}"
            )
        if value and not _is_link(value, shape):
            raise MalformedTaskMessageError(f"{name} must be signatures; got {shown(value)}")


def _is_link(value: object, shape: type) -> bool:
    if isinstance(value, dict):
        return shape is dict
    return shape is list and isinstance(value, list) and all(isinstance(v, dict) for v in value)


# -- the arguments -------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSignature:
    """The arguments a task accepts, read once from its ``run`` function."""

    name: str
    signature: inspect.Signature
    hints: Mapping[str, object]
    most_args: int | None  # None: takes *args
    keywords: frozenset[str] | None  # None: takes **kwargs
    linkable: bool  # False: a message with callbacks, errbacks, a chain or chord is refused

    @classmethod
    def of(cls, name: str, run: Callable[..., Any], *, linkable: bool = False) -> TaskSignature:
        """The signature of ``run`` (a bound task's ``run`` leaves out ``self``)."""
        signature = inspect.signature(run)
        try:
            hints = typing.get_type_hints(run)
        except Exception:  # an annotation that cannot be resolved is just not checked
            hints = {}
        params = list(signature.parameters.values())
        kinds = {param.kind for param in params}
        positional = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
        keyword = (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)
        return cls(
            name,
            signature,
            hints,
            None if _P.VAR_POSITIONAL in kinds else sum(p.kind in positional for p in params),
            None
            if _P.VAR_KEYWORD in kinds
            else frozenset(p.name for p in params if p.kind in keyword),
            linkable,
        )

    def __str__(self) -> str:
        params = [p.replace(annotation=p.empty) for p in self.signature.parameters.values()]
        plain = self.signature.replace(parameters=params, return_annotation=inspect.Signature.empty)
        return f"{self.name}{plain}"


def check_arguments(expected: TaskSignature, args: object, kwargs: object) -> None:
    """Refuse arguments that do not bind to the task's signature or fit its annotations."""
    if not isinstance(args, list | tuple):
        raise MalformedTaskMessageError(f"args must be a list; got {shown(args)}")
    if not isinstance(kwargs, dict):
        raise MalformedTaskMessageError(f"kwargs must be an object; got {shown(kwargs)}")
    # Counted before anything iterates them: a million arguments cost nothing here.
    if expected.most_args is not None and len(args) > expected.most_args:
        raise MalformedTaskMessageError(f"{len(args)} positional arguments for {expected}")
    if expected.keywords is not None:
        unknown = [
            k for k in islice(kwargs, len(expected.keywords) + 1) if k not in expected.keywords
        ]
        if unknown:
            raise MalformedTaskMessageError(
                f"unknown keyword argument {shown(unknown[0])} for {expected}"
            )
    try:
        bound = expected.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise MalformedTaskMessageError(f"arguments do not fit {expected}: {exc}") from None
    for name, value in bound.arguments.items():
        if expected.signature.parameters[name].kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            check_argument(name, value, expected.hints.get(name, Any))


def check_argument(name: str, value: object, hint: object) -> None:
    """Refuse ``value`` unless it fits ``hint`` (and, for an id argument, is a valid id)."""
    if not fits(value, hint):
        raise MalformedTaskMessageError(
            f"argument {name} must be {meaning(hint)}; got {shown(value)}"
        )
    bound = BOUNDED_ARGUMENTS.get(name)
    if bound is not None and isinstance(value, str) and len(value) > bound:
        raise MalformedTaskMessageError(
            f"argument {name} is {len(value)} characters, more than {bound}"
        )
    kind = ID_ARGUMENTS.get(name)
    if kind is not None and isinstance(value, str):
        try:
            validate_id(value, kind)
        except InvalidIdError as exc:
            raise MalformedTaskMessageError(f"argument {name}: {exc}") from None


def fits(value: object, hint: object) -> bool:
    """Whether a JSON value fits a simple annotation; what is not simple is not checked."""
    if hint is Any:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(fits(value, option) for option in typing.get_args(hint))
    if hint is type(None) or hint is None:
        return value is None
    if hint is int:
        return (
            isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT
        )
    if hint is float:
        return (isinstance(value, float) and math.isfinite(value)) or fits(value, int)
    base = typing.get_origin(hint) or hint
    return isinstance(value, base) if isinstance(base, type) else True


def meaning(hint: object) -> str:
    """An annotation in words: ``int | None`` is "int or null"."""
    if hint is type(None) or hint is None:
        return "null"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(meaning(option) for option in typing.get_args(hint))
    return hint.__name__ if isinstance(hint, type) else str(hint)


def check_message(
    expected: TaskSignature, headers: Mapping[str, Any], payload: object, *, named_in_headers: bool
) -> None:
    """Raise MalformedTaskMessageError unless the decoded message is a well-formed call of
    the task ``expected`` describes."""
    message = unpack(headers, payload, named_in_headers=named_in_headers)
    check_fields(message.fields)
    check_links(message.links, linkable=expected.linkable)
    check_arguments(expected, message.args, message.kwargs)


# -- the Celery hooks -----------------------------------------------------------------


def strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """``Task.Strategy`` of agentstate's tasks: Celery's default behind the checks above."""
    return _guarded(task, app, consumer, linkable=False, **options)


def _guarded(
    task: Any, app: Any, consumer: Any, *, linkable: bool, **options: Any
) -> Callable[..., Any]:
    handle = default_strategy(task, app, consumer, **options)
    expected = TaskSignature.of(task.name, task.run, linkable=linkable)

    def guarded(message: Any, body: Any, ack: Any, reject: Any, *rest: Any, **kw: Any) -> Any:
        # Celery passes no body for protocol 2 (it decodes it later) and the decoded body
        # for protocol 1; ``message.payload`` is that decoding, done once and cached.
        named_in_headers = body is None
        try:
            payload = message.payload if named_in_headers else body
            check_message(expected, message.headers, payload, named_in_headers=named_in_headers)
        except (MalformedTaskMessageError, DecodeError) as exc:
            task_id = (message.headers if named_in_headers else body).get("id")
            _refuse(consumer, message, f"{task.name}[{_id_shown(task_id)}]", exc)
            reject(logger, consumer.connection_errors, False)
            return None
        return handle(message, body, ack, reject, *rest, **kw)

    return guarded


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, refusing task names it could not look up (a list raises where
    no strategy can catch it) and guarding Celery's built-in tasks like agentstate's."""

    def update_strategies(self) -> None:
        """Celery's strategies, with the guard in front of every task still on the default."""
        super().update_strategies()
        for name, task in self.app.tasks.items():
            if task.Strategy == Task.Strategy:
                self.strategies[name] = _guarded(task, self.app, self, linkable=True)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        """Celery's handler of each task message, behind a check of the task's name."""
        handle = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> Any:
            name = _claimed_name(message)
            if name is not None and not isinstance(name, str):
                error = MalformedTaskMessageError(f"the task name is {shown(name)}")
                _refuse(self, message, "a task message", error)
                message.reject_log_error(logger, self.connection_errors)
                return None
            return handle(message)

        return on_task_received


def _claimed_name(message: Any) -> object:
    """The task name a message claims, or None where Celery reports the problem itself."""
    try:
        return message.headers["task"]
    except (TypeError, KeyError):
        pass
    try:
        return message.payload["task"]  # protocol 1
    except Exception:  # undecodable, not an object, no name: Celery's own errors
        return None


def _refuse(consumer: Any, message: Any, what: str, error: Exception) -> None:
    logger.error("refused %s: %s", what, one_line(str(error)))
    signals.task_rejected.send(sender=consumer, message=message, exc=error)


def _id_shown(task_id: object) -> str:
    return task_id if isinstance(task_id, str) and TASK_ID.fullmatch(task_id) else shown(task_id)
