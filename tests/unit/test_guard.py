"""The checks that keep a malformed broker message from reaching Celery's unpacking."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from config import Settings
from config.celery import celery_config
from state.errors import BadInputError, MalformedTaskMessageError
from state.sessions.snapshot import CARRY_MAX_CHARS
from tasks.app import app, make_app
from tasks.worker import baseline, maintenance, phases, steps
from tasks.worker.guard import GUARD_STRATEGY, TaskSignature, check_message, fits
from tasks.worker.guard_headers import MAX_REASON_CHARS, one_line, shown

PLANNING = "agentstate.phase.planning"
STEP = "agentstate.workflow.step"
TIMEOUT = "agentstate.session.timeout"
NO_LINKS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
REGISTERED = (baseline, maintenance, phases, steps)  # imported for their tasks


def expected(name: str) -> TaskSignature:
    task = app.tasks[name]
    return TaskSignature.of(task.name, task.run)


def headers(name: str = PLANNING, **extra: Any) -> dict[str, Any]:
    return {"lang": "py", "task": name, "id": "3f2a-task-id", **extra}


def check(name: str, body: object, **extra: Any) -> None:
    check_message(expected(name), headers(name, **extra), body, named_in_headers=True)


def refused(name: str, body: object, **extra: Any) -> str:
    with pytest.raises(MalformedTaskMessageError) as caught:
        check(name, body, **extra)
    return str(caught.value)


def test_the_error_is_bad_input() -> None:
    assert issubclass(MalformedTaskMessageError, BadInputError)


@pytest.mark.parametrize(
    "body", ["just a string", {"a": 1}, [1], None, 42, [[], {}], [[], {}, {}, {}], "", []]
)
def test_a_body_that_is_not_args_kwargs_embed_is_refused(body: object) -> None:
    assert "body must be [args, kwargs, embed]" in refused(PLANNING, body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([[], {}, "x"], "embed must be an object; got str 'x'"),
        (["s-1", {}, {}], "args must be a list; got str 's-1'"),
        ([["s-1"], [], {}], "kwargs must be an object; got list []"),
        ([["s-1"], {}, {"callbacks": [{"task": "x"}]}], "never linked; got callbacks"),
        ([["s-1"], {}, {"chord": {"task": "x"}}], "never linked; got chord"),
    ],
)
def test_a_misshapen_part_is_refused(body: object, reason: str) -> None:
    assert reason in refused(PLANNING, body)


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "reason"),
    [
        (PLANNING, [42, None], {}, "argument session_id must be str; got int 42"),
        (PLANNING, ["bad id!", None], {}, "argument session_id: invalid session id 'bad id!'"),
        (PLANNING, ["x" * 129], {}, "invalid session id"),
        (PLANNING, ["s-1", "1"], {}, "argument revision must be int or null; got str '1'"),
        (PLANNING, ["s-1", True], {}, "argument revision must be int or null; got bool True"),
        (PLANNING, ["s-1", 2**63], {}, "argument revision must be int or null"),
        (PLANNING, ["s-1", 1.0], {}, "argument revision must be int or null; got float 1.0"),
        (PLANNING, ["s-1", None, "x", "y"], {}, "4 positional arguments for"),
        (PLANNING, ["s-1", 1, {"doc": {}}], {}, "argument carried must be str or null; got dict"),
        (PLANNING, ["s-1", 1, "x" * (CARRY_MAX_CHARS + 1)], {}, "argument carried is 32769 char"),
        (PLANNING, [], {}, "missing a required argument: 'session_id'"),
        (PLANNING, ["s-1"], {"session_id": "s-2"}, "multiple values for argument 'session_id'"),
        (PLANNING, [], {"session_id": "s-1", "bogus": 1}, "unknown keyword argument str 'bogus'"),
        (PLANNING, [], {"self": 1}, "unknown keyword argument str 'self'"),
        (STEP, ["wf-1", "a", 1.5], {}, "argument revision must be int; got float 1.5"),
        (STEP, ["wf-1", "a b", 1], {}, "argument step_id: invalid step id 'a b'"),
        (STEP, ["wf/1", "a", 1], {}, "argument workflow_id: invalid workflow id"),
        (STEP, ["wf-1", "a", 1, ["x"]], {}, "argument carried must be str or null; got list"),
        (STEP, ["wf-1", "a", 1, "x" * (CARRY_MAX_CHARS + 1)], {}, "argument carried is 32769"),
        (STEP, ["wf-1", "a"], {}, "missing a required argument: 'revision'"),
        (TIMEOUT, ["s-1", "soon"], {}, "argument deadline must be float; got str 'soon'"),
        (TIMEOUT, ["s-1", math.nan], {}, "argument deadline must be float; got float nan"),
        (TIMEOUT, ["s-1", math.inf], {}, "argument deadline must be float"),
        ("agentstate.baseline.hop", ["3"], {}, "argument remaining must be int; got str '3'"),
        ("agentstate.recovery.sweep", [1], {}, "1 positional arguments for"),
    ],
)
def test_arguments_that_do_not_fit_the_task_are_refused(
    name: str, args: list[Any], kwargs: dict[str, Any], reason: str
) -> None:
    assert reason in refused(name, [args, kwargs, NO_LINKS])


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        (PLANNING, ["s-1", None], {}),
        (PLANNING, ["s-1", 7], {}),
        (PLANNING, ["s-1"], {}),
        (PLANNING, ["s-1", 3, "{}"], {}),
        (PLANNING, ["s-1", 3, "x" * CARRY_MAX_CHARS], {}),
        (PLANNING, [], {"session_id": "s-1", "revision": 3, "carried": None}),
        (PLANNING, [], {"session_id": "s-1", "revision": 3}),
        ("agentstate.phase.understanding", ["s.1:a-b_c", 0], {}),
        (STEP, ["wf-1", "a", 2], {}),
        (STEP, ["wf-1", "a", 2, "x" * CARRY_MAX_CHARS], {}),
        (TIMEOUT, ["s-1", 1_767_000_000.25], {}),
        (TIMEOUT, ["s-1", 1_767_000_000], {}),  # a whole deadline is still a float
        ("agentstate.recovery.sweep", [], {}),
        ("agentstate.baseline.noop", [], {}),
        ("agentstate.baseline.hop", [5, "c"], {}),
    ],
)
def test_a_well_formed_call_passes(name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    check(name, [args, kwargs, NO_LINKS])
    check(name, [args, kwargs, {}])  # links left out altogether are no links too


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"id": ["x"]}, "header id must be 1-255 visible ASCII characters; got list ['x']"),
        ({"id": ""}, "header id must be"),
        ({"id": "a b"}, "header id must be"),
        ({"id": "x" * 256}, "header id must be"),
        ({"timelimit": "x"}, "header timelimit must be"),
        ({"timelimit": [1]}, "header timelimit must be"),
        ({"timelimit": [None, "1"]}, "header timelimit must be"),
        ({"timelimit": [math.nan, None]}, "header timelimit must be"),
        ({"timelimit": [-1, None]}, "header timelimit must be"),
        ({"retries": "x"}, "header retries must be null or a whole number >= 0; got str 'x'"),
        ({"retries": -1}, "header retries must be"),
        ({"retries": True}, "header retries must be"),
        ({"eta": "not a date"}, "header eta must be null or an ISO 8601 timestamp"),
        ({"eta": ""}, "header eta must be"),  # Celery reads "" as no eta, then crashes on it
        ({"eta": 0}, "header eta must be"),
        # Far beyond anything agentstate schedules (a step's timer: a week at most).
        ({"eta": "2999-01-01T00:00:00+00:00"}, "s ahead; got str '2999-01-01"),
        ({"eta": (datetime.now(UTC) + timedelta(days=9)).isoformat()}, "header eta must be"),
        ({"eta": "2999-01-01T00:00:00"}, "header eta must be"),  # naive: UTC, as Celery reads it
        ({"expires": 5}, "header expires must be"),
        ({"stamped_headers": [[1]]}, "header stamped_headers must be"),
        ({"stamps": []}, "header stamps must be"),
        ({"shadow": ["x"]}, "header shadow must be"),
        ({"root_id": {"a": 1}}, "header root_id must be"),
        ({"argsrepr": "x" * 5000}, "header argsrepr must be"),
        ({"ignore_result": "yes"}, "header ignore_result must be"),
        ({"group_index": 1.5}, "header group_index must be"),
    ],
)
def test_headers_celery_cannot_use_are_refused(extra: dict[str, Any], reason: str) -> None:
    assert reason in refused(PLANNING, [["s-1"], {}, NO_LINKS], **extra)


def test_an_eta_within_what_agentstate_schedules_passes() -> None:
    # A step's timer of a week (the longest agentstate schedules) is due in 7 days.
    in_a_week = (datetime.now(UTC) + timedelta(days=7)).isoformat()
    check(PLANNING, [["s-1"], {}, NO_LINKS], eta=in_a_week)


def test_a_message_without_a_task_id_is_refused() -> None:
    no_id = {"lang": "py", "task": PLANNING}
    with pytest.raises(MalformedTaskMessageError, match="no task id"):
        check_message(expected(PLANNING), no_id, [["s-1"], {}, {}], named_in_headers=True)


def test_every_message_celery_itself_sends_passes() -> None:
    celery = make_app(Settings(broker_url="memory://"))
    variants: list[dict[str, Any]] = [
        {},
        {"countdown": 1.5},
        {"expires": 60, "time_limit": 30, "soft_time_limit": 20},
        {"retries": 4, "shadow": "planning again", "ignore_result": True},
        {"stamped_headers": ["on"], "on": "x", "root_id": "r", "parent_id": "p"},
    ]
    for options in variants:
        message = celery.amqp.as_task_v2("3f2a-task-id", PLANNING, ["s-1", 4], {}, **options)
        wire_headers = json.loads(json.dumps(message.headers))
        wire_body = json.loads(json.dumps(message.body))
        check_message(expected(PLANNING), wire_headers, wire_body, named_in_headers=True)


def test_protocol_1_and_hybrid_bodies_are_checked_the_same_way() -> None:
    good = {"task": PLANNING, "id": "3f2a", "args": ["s-1", 2], "kwargs": {}}
    check_message(expected(PLANNING), {}, good, named_in_headers=False)
    check_message(expected(PLANNING), headers(), {"args": ["s-1"]}, named_in_headers=True)
    cases = [
        ({}, {**good, "args": "just a string"}, False, "args must be a list"),
        ({}, {**good, "kwargs": []}, False, "kwargs must be an object"),
        ({}, {**good, "args": [42]}, False, "argument session_id must be str"),
        ({}, {**good, "id": 7}, False, "header id must be"),
        ({}, {**good, "callbacks": [{"task": "x"}]}, False, "never linked"),
        ({}, {"task": PLANNING, "args": ["s-1"]}, False, "no task id"),
        (headers(), {"args": "x", "kwargs": {}}, True, "args must be a list"),
        # In the hybrid form the headers win, as in Celery: a good body field hides nothing.
        (headers(timelimit="x"), {"args": ["s-1"], "timelimit": None}, True, "timelimit"),
    ]
    for head, body, named, reason in cases:
        with pytest.raises(MalformedTaskMessageError, match=reason):
            check_message(expected(PLANNING), head, body, named_in_headers=named)


def test_nothing_about_a_huge_or_deep_message_makes_the_check_expensive() -> None:
    deep: list[Any] = []
    for _ in range(100_000):  # far deeper than any recursion could go
        deep = [deep]
    assert "argument session_id must be str; got list [[[...]]]" in refused(
        PLANNING, [[deep], {}, {}]
    )
    assert "100000 positional arguments" in refused(PLANNING, [[deep] * 100_000, {}, {}])
    many = {f"k{i}": deep for i in range(100_000)}
    assert "unknown keyword argument" in refused(PLANNING, [[], many, {}])
    assert "never linked" in refused(PLANNING, [["s-1"], {}, {"callbacks": deep}])
    for value in (deep, many, "x" * 10_000_000, [["y" * 1000] * 1000] * 1000, 10**4000):
        assert len(shown(value)) <= 200


def test_shown_keeps_values_short_and_on_one_line() -> None:
    assert shown("just a string") == "str 'just a string'"
    assert shown(None) == "null"
    assert shown([1, [2, [3, [4]]], {"a": {"b": 1}}]) == "list [1, [2, [...]], {'a': {...}}]"
    assert shown(list(range(10))) == "list [0, 1, 2, 3, ...]"
    assert shown("line\nbreak") == "str 'line\\nbreak'"
    assert "\n" not in one_line("a\nb\r\nc") and one_line("a\nb") == "a b"
    assert len(one_line("x" * 10_000)) == MAX_REASON_CHARS


def test_fits_reads_json_values_strictly() -> None:
    assert fits(3, int) and not fits(True, int) and not fits(3.0, int)
    assert fits(3, float) and fits(3.5, float) and not fits(math.inf, float)
    assert fits(None, int | None) and not fits("1", int | None)
    assert fits({"a": 1}, dict[str, Any]) and not fits([], dict[str, Any])
    assert fits(object(), Any)


def test_the_signature_of_a_bound_task_leaves_out_self() -> None:
    assert str(expected(PLANNING)) == f"{PLANNING}(session_id, revision=None, carried=None)"
    assert str(expected(STEP)) == f"{STEP}(workflow_id, step_id, revision, carried=None)"
    assert str(expected(TIMEOUT)) == f"{TIMEOUT}(session_id, deadline)"


def test_every_agentstate_task_is_guarded_and_workers_use_the_guarding_consumer() -> None:
    ours = [task for name, task in app.tasks.items() if name.startswith("agentstate.")]
    assert len(ours) >= 12
    assert all(task.Strategy == GUARD_STRATEGY for task in ours)
    assert celery_config(Settings())["worker_consumer"] == "tasks.worker.guard:Consumer"


def test_tasks_that_may_be_linked_get_a_shape_check_of_their_links() -> None:
    task = app.tasks["celery.accumulate"]  # Celery's own: guarded by the worker's consumer
    linkable = TaskSignature.of(task.name, task.run, linkable=True)
    link = {"task": "x", "args": [], "kwargs": {}, "options": {}}
    good = [[1, 2], {}, {"callbacks": [link], "errbacks": None, "chain": [], "chord": link}]
    check_message(linkable, headers(task.name), good, named_in_headers=True)
    for links in ({"callbacks": "x"}, {"errbacks": [1]}, {"chord": [link]}, {"chain": link}):
        with pytest.raises(MalformedTaskMessageError, match="must be signatures"):
            check_message(linkable, headers(task.name), [[], {}, links], named_in_headers=True)
