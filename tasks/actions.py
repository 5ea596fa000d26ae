"""Workflow actions: ``@action("name")`` registers ``fn(inputs, deps, context) -> dict``.

Workers import the modules named in ``AGENTSTATE_ACTION_MODULES`` at start, so an app's
actions register themselves by being imported, and publish the names they serve
(:func:`publish_actions`). Built-ins: echo, sleep, calculate, fail. Errors for action
authors (``PermanentActionError``) are imported from ``state.errors``; docs/guides/actions.md.
"""

from __future__ import annotations

import importlib
import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from config import Settings, get_settings, redact_url
from state.agent import quick
from state.calculator import evaluate
from state.documents.codec import Document
from state.errors import (
    ActionFailed,
    ActionRegistrationError,
    ConfigurationError,
    PermanentActionError,
)
from state.storage.db import get_engine
from state.workflows.served import ServedActions

__all__ = ["action", "get_action", "import_action_modules", "known_actions", "publish_actions"]

logger = logging.getLogger(__name__)

ActionFn = Callable[[Document, Document, Document], Document]
MAX_SLEEP_S = 3600.0

_registry: dict[str, ActionFn] = {}
_schemas: dict[str, Document] = {}
_imported_modules: set[str] = set()
# What a step's ``inputs`` may be when an action declares nothing (MCP shows it as the
# tool's input schema).
ANY_INPUTS: Document = {"type": "object", "additionalProperties": True}


def action(name: str, *, inputs: Document | None = None) -> Callable[[ActionFn], ActionFn]:
    """Register the decorated function as the workflow action ``name``.

    The function is called as ``fn(inputs, deps, context)`` once per attempt of a step
    that names it:

    - ``inputs``: the step's ``inputs`` from the spec;
    - ``deps``: the outputs of the step's dependencies, by step id
      (``{"intro": {"words": 3}}``; ``{}`` without dependencies);
    - ``context``: the workflow's shared ``context`` and, when present,
      ``context["idempotency_key"]`` (the same for every attempt of the step).

    It returns a JSON object (the step's ``outputs``). A raised exception is retried
    with exponential backoff up to the step's ``max_retries`` (default 3), then the
    step fails and its dependents are skipped. Raise ``state.errors.PermanentActionError``
    (or an exception whose class has ``retryable = False``) to fail the step at once.
    The step's state changes apply exactly once; an external side effect may repeat if
    a worker dies mid-step, so pass the idempotency key to the external system.

    An action with no side effects that finishes in milliseconds may also be decorated
    with ``state.agent.quick``: its step is then not claimed (marked running) before it
    runs, so it commits once instead of twice. Two deliveries of it may both run it; the
    first success commits and the other changes nothing. A step with ``timeout_s``, a
    timer or an approval is claimed all the same.

    Workers publish the names they serve when they start, so a sender need not import
    the module to start a workflow that uses it.

    Args:
        name: the name specs use in ``"action"``; one function per name.
        inputs: a JSON Schema of the step's ``inputs`` (optional): the MCP door shows it
            as the input schema of the action's tool.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Example::

        from state.errors import PermanentActionError
        from tasks.actions import action

        @action("reverse")
        def reverse(inputs, deps, context):
            if not isinstance(inputs.get("text"), str):
                raise PermanentActionError("'text' must be a string")
            return {"text": inputs["text"][::-1]}
    """
    if not isinstance(name, str) or not name:
        raise ActionRegistrationError("an action needs a non-empty name")

    def register(fn: ActionFn) -> ActionFn:
        existing = _registry.get(name)
        if existing is not None and existing.__qualname__ != fn.__qualname__:
            raise ActionRegistrationError(
                f"action {name!r} is already registered by {existing.__module__}"
            )
        _registry[name] = fn
        if inputs is not None:
            _schemas[name] = inputs
        return fn

    return register


def action_inputs(name: str) -> Document:
    """The JSON Schema of the inputs action ``name`` declared (any object if none)."""
    return _schemas.get(name, ANY_INPUTS)


def action_description(name: str) -> str:
    """The first line of the action's docstring (empty for one not imported here)."""
    fn = _registry.get(name)
    doc = (fn.__doc__ or "").strip() if fn is not None else ""
    return doc.splitlines()[0] if doc else ""


def import_action_modules(modules: list[str] | None = None) -> None:
    """Import the app's action modules (AGENTSTATE_ACTION_MODULES), each once.

    Raises:
        ConfigurationError: a module cannot be imported (named, with the reason in one
            line: the CLI exits 2 with it, a worker refuses to start with it).
    """
    for module in modules if modules is not None else get_settings().action_module_list:
        if module not in _imported_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise ConfigurationError(
                    f"cannot import action module {module!r} (AGENTSTATE_ACTION_MODULES): "
                    f"{describe_failure(exc)}"
                ) from exc
            _imported_modules.add(module)


def describe_failure(exc: BaseException) -> str:
    """``Type: message``, and where a module's own code raised it (not a traceback)."""
    if isinstance(exc, ImportError):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    return text


def get_action(name: str) -> ActionFn | None:
    """The action registered as ``name``, or None."""
    import_action_modules()
    return _registry.get(name)


def known_actions(modules: list[str] | None = None) -> list[str]:
    """Every registered action name (after importing ``modules``, default: Settings')."""
    import_action_modules(modules)
    return sorted(_registry)


def publish_actions(worker: str, settings: Settings | None = None) -> None:
    """Record the actions this process serves in the database (``ServedActions``).

    Called when a worker starts, after importing AGENTSTATE_ACTION_MODULES, so that a
    sender that never imported those modules can still start workflows that use them.
    A failure is logged, not raised: the worker starts anyway, and senders still know
    the actions they imported themselves.
    """
    settings = settings or get_settings()
    try:
        import_action_modules(settings.action_module_list)
        engine = get_engine(settings.database_url, auto_migrate=settings.auto_migrate)
        served = {name: fn.__module__ for name, fn in _registry.items()}
        ServedActions(engine).publish(worker, served)
        # A prefork worker's main process runs no task: hand no open socket to its children.
        engine.dispose()
    except Exception as exc:
        first_line = (redact_url(str(exc)).splitlines() or [type(exc).__name__])[0]
        logger.warning("could not publish this worker's actions: %s", first_line)
        return
    logger.info("%s serves actions: %s", worker, ", ".join(sorted(served)))


@action("echo", inputs=ANY_INPUTS)
@quick
def echo(inputs: Document, deps: Document, context: Document) -> Document:
    """Return the step's inputs."""
    return dict(inputs)


@action(
    "sleep",
    inputs={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_S}},
    },
)
def sleep(inputs: Document, deps: Document, context: Document) -> Document:
    """Sleep ``seconds`` (at most an hour); other values fail the step without a retry."""
    seconds = inputs.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise PermanentActionError(f"seconds must be a number, not {type(seconds).__name__}")
    if not 0 <= seconds <= MAX_SLEEP_S:
        raise PermanentActionError(f"seconds must be between 0 and {MAX_SLEEP_S:g}")
    time.sleep(seconds)
    return {"slept": seconds}


@action(
    "calculate",
    inputs={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2+3*4"}},
        "required": ["expression"],
    },
)
@quick
def calculate(inputs: Document, deps: Document, context: Document) -> Document:
    """Evaluate ``expression``; a dependency's step id stands for its output ``value``.

    A bad expression raises CalculationError, which is not retried (it would fail again).
    """
    names = {
        step_id: output["value"]
        for step_id, output in deps.items()
        if isinstance(output, dict) and isinstance(output.get("value"), int | float)
    }
    return {"value": evaluate(str(inputs.get("expression", "")), names)}


@action(
    "fail",
    inputs={
        "type": "object",
        "properties": {"message": {"type": "string"}, "retryable": {"type": "boolean"}},
    },
)
def fail(inputs: Document, deps: Document, context: Document) -> Document:
    """Fail with ``message``: at once, or under ``max_retries`` with ``retryable: true``."""
    message = str(inputs.get("message", "failed on purpose"))
    if inputs.get("retryable") is True:
        raise ActionFailed(message)
    raise PermanentActionError(message)
