"""Workflow actions for tests (AGENTSTATE_ACTION_MODULES=tests.actions_for_tests).

Side effects are counted in Redis so that tests can prove each step ran exactly once.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from config import get_settings
from state.agent import quick
from tasks.actions import action

Document = dict[str, Any]


def _redis() -> redis.Redis:
    return redis.Redis.from_url(get_settings().redis_url)


def effects_key(workflow_id: str) -> str:
    return f"test:effects:{workflow_id}"


@action("count")
def count(inputs: Document, deps: Document, context: Document) -> Document:
    """Record one side effect per run, keyed by workflow and step."""
    _redis().hincrby(effects_key(context["run"]), inputs["name"], 1)
    return {"value": 1 + sum(d.get("value", 0) for d in deps.values())}


@action("flaky")
def flaky(inputs: Document, deps: Document, context: Document) -> Document:
    """Fail the first ``failures`` attempts, then succeed."""
    attempts = _redis().hincrby(effects_key(context["run"]), f"{inputs['name']}:attempts", 1)
    if attempts <= int(inputs["failures"]):
        raise RuntimeError(f"flaky failure {attempts}")
    return {"attempts": attempts}


@action("slow_count")
def slow_count(inputs: Document, deps: Document, context: Document) -> Document:
    """Sleep, then record a side effect (a window for killing the worker mid-step)."""
    time.sleep(float(inputs.get("seconds", 1.0)))
    _redis().hincrby(effects_key(context["run"]), inputs["name"], 1)
    return {"value": 1}


@action("not_finite")
def not_finite(inputs: Document, deps: Document, context: Document) -> Document:
    """Return a number JSON cannot hold (orjson alone would store it as null)."""
    return {"value": float(inputs.get("value", "nan"))}


@action("record_key")
def record_key(inputs: Document, deps: Document, context: Document) -> Document:
    """Record the step's idempotency key on every attempt; fail the first ``failures``."""
    store = _redis()
    key = effects_key(context["run"])
    attempts = store.hincrby(key, f"{inputs['name']}:attempts", 1)
    store.rpush(f"{key}:keys", context["idempotency_key"])
    if attempts <= int(inputs.get("failures", 0)):
        raise RuntimeError(f"failing attempt {attempts} on purpose")
    return {"key": context["idempotency_key"]}


@action("gate")
def gate(inputs: Document, deps: Document, context: Document) -> Document:
    """Wait (at most ``seconds``) until the test opens the gate, then record an effect:
    a step that is surely running while the test acts on it."""
    store = _redis()
    key = effects_key(context["run"])
    store.hset(key, f"{inputs['name']}:started", 1)
    deadline = time.monotonic() + float(inputs.get("seconds", 10.0))
    while time.monotonic() < deadline and not store.exists(f"{key}:open"):
        time.sleep(0.02)
    store.hincrby(key, inputs["name"], 1)
    return {"value": 1}


@action("sized_output")
def sized_output(inputs: Document, deps: Document, context: Document) -> Document:
    """Return about ``bytes`` bytes of JSON (for the step output limit)."""
    return {"data": "z" * max(0, int(inputs["bytes"]) - 11)}


@action("quick_count")
@quick
def quick_count(inputs: Document, deps: Document, context: Document) -> Document:
    """A quick action (run without a claim) that counts its runs, so a test can tell a
    run from a commit; fails its first ``failures`` runs. ``seconds`` stretches it (a
    window for killing its worker: a real quick action takes milliseconds)."""
    time.sleep(float(inputs.get("seconds", 0.0)))
    runs = _redis().hincrby(effects_key(context["run"]), inputs["name"], 1)
    if runs <= int(inputs.get("failures", 0)):
        raise RuntimeError(f"quick failure {runs}")
    return {"value": 1 + sum(d.get("value", 0) for d in deps.values())}


@action("context_secret")
def context_secret(inputs: Document, deps: Document, context: Document) -> Document:
    """The ``tenant_secret`` of the context the step was handed."""
    return {"seen": context.get("tenant_secret")}


@action("quick_context_secret")
@quick
def quick_context_secret(inputs: Document, deps: Document, context: Document) -> Document:
    """``context_secret``, run inline (from what its message carries)."""
    return {"seen": context.get("tenant_secret")}
