"""Workflow specs: the JSON a caller hands to ``start_workflow``, validated completely
(keys, ids, sizes, timings, dependencies, cycles) before anything is stored, and turned
into a :class:`state.workflow.WorkflowState`. A spec past a limit is refused, naming it.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from config import Settings, get_settings
from state.documents.codec import json_size, require_storable, too_large
from state.errors import (
    InvalidIdError,
    InvalidPayloadError,
    UnknownActionError,
    WorkflowSpecError,
)
from state.ids import STEP_KEY_SEPARATOR, new_id, validate_id
from state.workflow import DEFAULT_MAX_RETRIES, WorkflowState, WorkflowStep, WorkflowStepStatus

MAX_STEPS = 10_000
MAX_STEP_NAME_LENGTH = 255
MAX_NAME_LENGTH = 128
MAX_RETRIES_LIMIT = 100
MAX_STEP_SECONDS = 7 * 24 * 3600.0  # timers and timeouts up to a week

# The public spec keys (docs/guides/workflows.md). A key outside these is refused, naming the
# nearest valid one: a typo such as "depends_on" must not silently run a step early.
SPEC_KEYS = ("workflow_id", "session_id", "context", "steps")
STEP_KEYS = (
    *("step_id", "step_name", "action", "inputs", "dependencies", "max_retries"),
    *("timeout_s", "not_before_s", "approval"),
)
_NAMED_KEYS = 5
_SHOWN_KEY_CHARS = 64


@dataclass(frozen=True)
class SpecLimits:
    """What one workflow spec may cost; a spec past a limit is refused, naming it."""

    max_bytes: int  # the whole spec as JSON (AGENTSTATE_MAX_SPEC_BYTES)
    max_links: int  # dependency links over all steps (AGENTSTATE_MAX_SPEC_LINKS)
    max_step_io_bytes: int  # one step's inputs as JSON (AGENTSTATE_MAX_STEP_IO_BYTES)

    @classmethod
    def from_settings(cls, settings: Settings) -> SpecLimits:
        """The limits ``settings`` sets."""
        return cls(settings.max_spec_bytes, settings.max_spec_links, settings.max_step_io_bytes)


def parse_spec(
    spec: object,
    known_actions: Iterable[str] | None = None,
    max_steps: int = MAX_STEPS,
    limits: SpecLimits | None = None,
) -> WorkflowState:
    """Validate a workflow spec completely and build its state; raise WorkflowSpecError.

    Sizes are checked first and cheaply (the JSON size, then the number of dependency
    links), so an oversized spec costs one serialization, never a graph. ``limits``
    defaults to the settings' (AGENTSTATE_MAX_SPEC_BYTES, ..._SPEC_LINKS, ..._STEP_IO_BYTES).
    """
    if not isinstance(spec, dict):
        raise WorkflowSpecError("workflow spec must be a JSON object")
    _check_keys(spec, SPEC_KEYS, "workflow spec")
    limits = limits or SpecLimits.from_settings(get_settings())
    _check_size(spec, limits.max_bytes)
    raw_steps = spec.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise WorkflowSpecError("workflow spec needs a non-empty 'steps' list")
    if len(raw_steps) > max_steps:
        raise WorkflowSpecError(f"workflow has {len(raw_steps)} steps; the limit is {max_steps}")
    _check_link_count(raw_steps, limits.max_links)
    context = spec.get("context", {})
    if not isinstance(context, dict):
        raise WorkflowSpecError("'context' must be a JSON object")
    _storable(context, "'context'")
    actions = None if known_actions is None else set(known_actions)
    steps: dict[str, WorkflowStep] = {}
    for index, raw in enumerate(raw_steps):
        step = _parse_step(raw, index, actions, limits.max_step_io_bytes)
        if step.step_id in steps:
            raise WorkflowSpecError(f"duplicate step id {step.step_id!r}")
        steps[step.step_id] = step
    _check_dependencies(steps)
    return WorkflowState(
        workflow_id=_optional_id(spec, "workflow_id") or new_id("wf"),
        session_id=_optional_id(spec, "session_id"),
        steps=steps,
        context=context,
        spec_hash=spec_fingerprint(spec),
    )


def _check_keys(raw: dict[str, Any], valid: tuple[str, ...], where: str) -> None:
    unknown = [key for key in raw if key not in valid]
    if not unknown:
        return
    named = [_suggest(key, valid) for key in unknown[:_NAMED_KEYS]]
    if len(unknown) > _NAMED_KEYS:
        named.append(f"and {len(unknown) - _NAMED_KEYS} more")
    plural = "s" if len(unknown) > 1 else ""
    raise WorkflowSpecError(
        f"{where}: unknown key{plural} {', '.join(named)}; valid keys: {', '.join(valid)}"
    )


def _suggest(key: object, valid: tuple[str, ...]) -> str:
    shown = repr(key)
    if len(shown) > _SHOWN_KEY_CHARS:
        shown = shown[: _SHOWN_KEY_CHARS - 3] + "..."
    close = difflib.get_close_matches(str(key), valid, n=1)
    return f"{shown} (did you mean {close[0]!r}?)" if close else shown


def _check_size(spec: dict[str, Any], max_bytes: int) -> None:
    try:
        size = json_size(spec, "workflow spec")
    except InvalidPayloadError as exc:
        raise WorkflowSpecError(str(exc)) from exc
    if size > max_bytes:
        raise WorkflowSpecError(
            too_large("workflow spec", size, max_bytes, "AGENTSTATE_MAX_SPEC_BYTES")
        )


def _check_link_count(raw_steps: list[Any], max_links: int) -> None:
    # Counted on the raw spec, before any step is built: links cost graph work later.
    links = sum(
        len(deps)
        for raw in raw_steps
        if isinstance(raw, dict) and isinstance(deps := raw.get("dependencies"), list)
    )
    if links > max_links:
        raise WorkflowSpecError(
            f"workflow has {links} dependency links; the limit is {max_links} "
            "(AGENTSTATE_MAX_SPEC_LINKS)"
        )


def _storable(value: object, what: str) -> str:
    try:
        return require_storable(value, what)
    except InvalidPayloadError as exc:
        raise WorkflowSpecError(str(exc)) from exc


def _optional_id(spec: dict[str, Any], key: str) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    try:
        return validate_id(value, key.removesuffix("_id"))
    except InvalidIdError as exc:
        raise WorkflowSpecError(str(exc)) from exc


def _parse_step(
    raw: object, index: int, actions: set[str] | None, max_io_bytes: int
) -> WorkflowStep:
    where = f"step #{index + 1}"
    if not isinstance(raw, dict):
        raise WorkflowSpecError(f"{where} must be a JSON object")
    try:
        step_id = validate_id(raw.get("step_id"), "step")
    except InvalidIdError as exc:
        raise WorkflowSpecError(f"{where}: {exc}") from exc
    if STEP_KEY_SEPARATOR in step_id:
        # Workflow ids may hold ':', so only a ':'-free step id makes step_key one-to-one.
        raise WorkflowSpecError(f"{where}: step id {step_id!r} may not contain ':'")
    where = f"step {step_id!r}"
    _check_keys(raw, STEP_KEYS, where)
    _check_timing(raw, where)
    action = raw.get("action")
    if not isinstance(action, str) or not action:
        raise WorkflowSpecError(f"{where} needs an 'action' name")
    if actions is not None and action not in actions:
        raise UnknownActionError(f"{where}: unknown action {action!r}{_known(action, actions)}")
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise WorkflowSpecError(f"{where}: 'inputs' must be a JSON object")
    size = len(_storable(inputs, f"{where}: 'inputs'").encode())
    if size > max_io_bytes:
        what = f"{where}: 'inputs'"
        raise WorkflowSpecError(too_large(what, size, max_io_bytes, "AGENTSTATE_MAX_STEP_IO_BYTES"))
    if len(action) > MAX_NAME_LENGTH:
        raise WorkflowSpecError(f"{where}: the action name is longer than {MAX_NAME_LENGTH}")
    step_name = str(raw.get("step_name") or step_id)
    if len(step_name) > MAX_STEP_NAME_LENGTH:
        raise WorkflowSpecError(f"{where}: 'step_name' is longer than {MAX_STEP_NAME_LENGTH}")
    return WorkflowStep(
        step_id=step_id,
        step_name=step_name,
        status=WorkflowStepStatus.PENDING,
        dependencies=_parse_dependencies(raw.get("dependencies", []), where),
        inputs=inputs,
        outputs={},
        max_retries=_parse_max_retries(raw.get("max_retries", DEFAULT_MAX_RETRIES), where),
        action=action,
        timeout_s=_seconds(raw, "timeout_s"),
        not_before_s=_seconds(raw, "not_before_s"),
        approval=bool(raw.get("approval", False)),
    )


def _known(action: str, actions: set[str]) -> str:
    close = difflib.get_close_matches(action, sorted(actions), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f" ({hint}known: {', '.join(sorted(actions))})"


def _check_timing(raw: dict[str, Any], where: str) -> None:
    """Check a step's ``timeout_s``, ``not_before_s`` and ``approval``."""
    for key in ("timeout_s", "not_before_s"):
        if key not in raw:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkflowSpecError(f"{where}: {key!r} must be a number of seconds")
        if not math.isfinite(value) or value < 0 or (key == "timeout_s" and value == 0):
            bound = "above 0" if key == "timeout_s" else "0 or more"
            raise WorkflowSpecError(f"{where}: {key!r} must be {bound} (and finite)")
        if value > MAX_STEP_SECONDS:
            raise WorkflowSpecError(f"{where}: {key!r} must be at most {MAX_STEP_SECONDS:g}")
    if "approval" in raw and not isinstance(raw["approval"], bool):
        raise WorkflowSpecError(f"{where}: 'approval' must be true or false")


def _parse_dependencies(deps: object, where: str) -> list[str]:
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise WorkflowSpecError(f"{where}: 'dependencies' must be a list of step ids")
    if len(set(deps)) != len(deps):
        raise WorkflowSpecError(f"{where}: a dependency is listed twice")
    return list(deps)


def _parse_max_retries(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkflowSpecError(f"{where}: 'max_retries' must be an integer")
    if not 0 <= value <= MAX_RETRIES_LIMIT:
        raise WorkflowSpecError(f"{where}: 'max_retries' must be 0-{MAX_RETRIES_LIMIT}")
    return value


def _seconds(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    return None if value is None else float(value)


def spec_fingerprint(spec: dict[str, Any]) -> str:
    """A hash of the spec's meaning (key order and spacing do not matter): a repeated
    start of one workflow id is the same request only if this is the same."""
    canonical = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _check_dependencies(steps: dict[str, WorkflowStep]) -> None:
    for step in steps.values():
        for dep in step.dependencies:
            if dep not in steps:
                raise WorkflowSpecError(
                    f"step {step.step_id!r} depends on {dep!r}, which is not a step"
                )
            if dep == step.step_id:
                raise WorkflowSpecError(f"step {step.step_id!r} depends on itself")
    cycle = find_cycle(steps)
    if cycle:
        raise WorkflowSpecError("dependency cycle: " + " -> ".join(cycle))


def find_cycle(steps: dict[str, WorkflowStep]) -> list[str]:
    """One dependency cycle as a path (first id repeated at the end), or [] if acyclic."""
    remaining = {sid: len(step.dependencies) for sid, step in steps.items()}
    dependents: dict[str, list[str]] = {sid: [] for sid in steps}
    for step in steps.values():
        for dep in step.dependencies:
            dependents[dep].append(step.step_id)
    queue = deque(sid for sid, n in remaining.items() if n == 0)
    while queue:
        for child in dependents[queue.popleft()]:
            remaining[child] -= 1
            if remaining[child] == 0:
                queue.append(child)
    stuck = {sid for sid, n in remaining.items() if n > 0}
    if not stuck:
        return []
    return _walk_cycle(steps, stuck)


def _walk_cycle(steps: dict[str, WorkflowStep], stuck: set[str]) -> list[str]:
    # Every stuck step has a stuck dependency, so walking dependencies must revisit one.
    node = min(stuck)
    position: dict[str, int] = {}
    path: list[str] = []
    while node not in position:
        position[node] = len(path)
        path.append(node)
        node = next(d for d in steps[node].dependencies if d in stuck)
    cycle = [*path[position[node] :], node]
    cycle.reverse()  # read in execution order: a -> b means b depends on a
    return cycle
