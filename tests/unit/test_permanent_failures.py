"""Which action errors a retry can fix: the built-ins fail for good where it cannot."""

from __future__ import annotations

from typing import Any

import pytest

from state.errors import ActionFailed, CalculationError, PermanentActionError
from state.workflows.retries import retryable
from tasks import actions


def run(name: str, inputs: dict[str, Any], deps: dict[str, Any] | None = None) -> Any:
    fn = actions.get_action(name)
    assert fn is not None
    return fn(inputs, deps or {}, {})


def raised(name: str, inputs: dict[str, Any]) -> BaseException:
    with pytest.raises(Exception) as info:
        run(name, inputs)
    return info.value


@pytest.mark.parametrize("expression", ["1/0", "2**", "nope", "", "10**1000"])
def test_a_bad_expression_is_not_retried(expression: str) -> None:
    error = raised("calculate", {"expression": expression})
    assert isinstance(error, CalculationError)
    assert not retryable(error)


@pytest.mark.parametrize("seconds", [-1, 3601, "soon", None, True, [1], float("nan")])
def test_bad_sleep_seconds_are_not_retried(seconds: object) -> None:
    error = raised("sleep", {"seconds": seconds})
    assert isinstance(error, PermanentActionError) and "seconds must be" in str(error)
    assert not retryable(error)


def test_sleep_still_sleeps() -> None:
    assert run("sleep", {"seconds": 0}) == {"slept": 0}
    assert run("sleep", {"seconds": 0.01}) == {"slept": 0.01}


def test_fail_is_permanent_unless_asked_to_be_retryable() -> None:
    error = raised("fail", {"message": "no luck"})
    assert isinstance(error, PermanentActionError) and str(error) == "no luck"
    assert not retryable(error)
    again = raised("fail", {"message": "try again", "retryable": True})
    assert type(again) is ActionFailed and retryable(again)
    assert not retryable(raised("fail", {"retryable": "yes"}))  # only true itself


def test_ordinary_exceptions_are_retried_and_a_class_may_opt_out() -> None:
    class Declined(Exception):
        retryable = False

    assert retryable(RuntimeError("flaky")) and retryable(ConnectionError())
    assert not retryable(Declined())
    assert issubclass(PermanentActionError, ActionFailed)
