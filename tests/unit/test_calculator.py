"""Safe arithmetic: what the calculator computes and what it refuses."""

from __future__ import annotations

import ast
import inspect
import sys

import pytest

from state import calculator
from state.calculator import MAX_MAGNITUDE, MAX_NESTING, evaluate, format_number
from state.errors import AgentStateError, CalculationError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12*7", 84),
        ("2+3", 5),
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("2*(3+4)*(5-1)", 56),
        ("10-4-3", 3),
        ("100/4/5", 5.0),
        ("-3", -3),
        ("-3+5", 2),
        ("2*-3", -6),
        ("-(2+3)", -5),
        ("--3", 3),
        ("+4", 4),
        ("-2**2", -4),
        ("1.5*2", 3.0),
        ("0.5+0.25", 0.75),
        (".5*4", 2.0),
        ("7/2", 3.5),
        ("2^10", 1024),
        ("2**10", 1024),
        ("2^3^2", 512),
        ("2^-1", 0.5),
        ("7%3", 1),
        ("-7%3", 2),
        ("7//2", 3),
        ("-7//2", -4),
        ("7.5//2", 3.0),
        ("  1 + 1  ", 2),
        ("3 \u00d7 4", 12),
        ("8 \u00f7 2", 4.0),
        ("2**62", 2**62),
        ("-(2**62)", -(2**62)),
        ("0", 0),
    ],
)
def test_arithmetic(expression: str, expected: float) -> None:
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "names", "expected"),
    [
        ("a+b", {"a": 2, "b": 3}, 5),
        ("a*a", {"a": 1.5}, 2.25),
        ("step_1 * 2", {"step_1": 21}, 42),
        ("x", {"x": -7}, -7),
    ],
)
def test_names(expression: str, names: dict[str, float], expected: float) -> None:
    assert evaluate(expression, names) == expected


def test_calculation_error_is_an_agentstate_error() -> None:
    assert issubclass(CalculationError, AgentStateError)


@pytest.mark.parametrize(
    ("expression", "names", "match"),
    [
        ("1/0", None, "division by zero"),
        ("1/(2-2)", None, "division by zero"),
        ("1.0/0.0", None, "division by zero"),
        ("5%0", None, "division by zero"),
        ("5//0", None, "division by zero"),
        ("2**1001", None, "exponent"),
        ("2^5000", None, "exponent"),
        ("2**-1001", None, "exponent"),
        ("9**999**999", None, "too large"),
        ("2**63", None, "too large"),
        ("10**19", None, "too large"),
        ("10**60*10**60", None, "too large"),
        ("2**400 // 2**399", None, "too large"),  # intermediates are bounded too
        ("1" + "0" * 101, None, "too large"),
        ("a*10", {"a": 2**62}, "too large"),
        ("1e308*10", None, "finite"),
        ("1e400", None, "finite"),
        ("(-8)**0.5", None, "real number"),
        ("x+1", None, "unknown name 'x'"),
        ("a+b", {"a": 1}, "unknown name 'b'"),
        ("__import__('os')", None, "unsupported"),
        ("__import__('os').system('true')", None, "unsupported"),
        ("abs(1)", None, "unsupported"),
        ("abs(-1)", {"abs": 1}, "unsupported"),
        ("(1).real", None, "unsupported"),
        ("a.b", {"a": 1}, "unsupported"),
        ("'a'", None, "unsupported"),
        ("'a'*3", None, "unsupported"),
        ("b'a'", None, "unsupported"),
        ("True+1", None, "boolean"),
        ("False", None, "boolean"),
        ("None", None, "unsupported"),
        ("1j", None, "unsupported"),
        ("lambda: 1", None, "unsupported"),
        ("[x for x in (1, 2)]", None, "unsupported"),
        ("(x for x in (1,))", None, "unsupported"),
        ("[1, 2]", None, "unsupported"),
        ("(1, 2)", None, "unsupported"),
        ("{1: 2}", None, "unsupported"),
        ("1 if 1 else 2", None, "unsupported"),
        ("1 < 2", None, "unsupported"),
        ("1 and 2", None, "unsupported"),
        ("~1", None, "unsupported"),
        ("1 << 3", None, "unsupported"),
        ("1 & 3", None, "unsupported"),
        ("f'{1}'", None, "unsupported"),
        ("x := 1", None, "not an arithmetic expression"),
        ("", None, "non-empty"),
        ("   ", None, "non-empty"),
        ("1+" * 500 + "1", None, "longer than 1000"),
        ("1+", None, "not an arithmetic expression"),
        ("(1+2", None, "not an arithmetic expression"),
        ("1 2", None, "not an arithmetic expression"),
        ("import os", None, "not an arithmetic expression"),
        ("2^^3", None, "not an arithmetic expression"),
    ],
)
def test_refused(expression: str, names: dict[str, int] | None, match: str) -> None:
    with pytest.raises(CalculationError, match=match):
        evaluate(expression, names)


@pytest.mark.parametrize("expression", [None, 12, b"1+1", ["1"]])
def test_non_string_is_refused(expression: object) -> None:
    with pytest.raises(CalculationError):
        evaluate(expression)  # type: ignore[arg-type]


def test_length_limit_is_1000_characters() -> None:
    at_limit = "1+" * 499 + "10"  # 1000 characters
    assert len(at_limit) == 1000
    assert evaluate(at_limit) == 509
    with pytest.raises(CalculationError):
        evaluate(at_limit + "0")


def test_magnitude_limit_is_inclusive() -> None:
    assert MAX_MAGNITUDE == 2**63 - 1  # what a stored JSON number can hold
    assert evaluate(str(MAX_MAGNITUDE)) == MAX_MAGNITUDE
    assert evaluate(f"-{MAX_MAGNITUDE}") == -MAX_MAGNITUDE


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (84.0, "84"),
        (84, "84"),
        (0.5, "0.5"),
        (-3.0, "-3"),
        (0.1 + 0.2, "0.3"),
        (1 / 3, "0.333333333333"),
        (2.5e-7, "2.5e-07"),
        (1e20, "1e+20"),
        (10**30, "1" + "0" * 30),
        (-7, "-7"),
        (0.0, "0"),
    ],
)
def test_format_number(value: float, expected: str) -> None:
    assert format_number(value) == expected


# --- hostile expressions: refused with a CalculationError, at once, without recursion ---


@pytest.mark.parametrize(
    ("expression", "names", "match"),
    [
        ("-" * 998 + "1", None, "nested more than 100 levels"),
        ("-" * MAX_NESTING + "1", None, "nested more than 100 levels"),
        ("1**" * 150 + "1", None, "nested more than 100 levels"),
        ("1-(" * 120 + "1" + ")" * 120, None, "nested more than 100 levels"),
        ("1e999**0", None, "a number in the expression is not finite"),
        ("1e999*0", None, "not finite"),
        ("0*-1e400", None, "not finite"),
        ("1e999-1e999", None, "not finite"),
        # A huge literal is refused before any arithmetic makes it huger.
        ("9" * 990 + "**999", None, "a number in the expression is too large"),
        ("(1" + "0" * 100 + ")%7", None, "a number in the expression is too large"),
        ("9**999*9**999", None, "too large"),
        ("10**1000", None, "too large"),
        ("(2**62)**1000", None, "too large"),
        ("a*1", {"a": float("nan")}, "the value of 'a' is not finite"),
        ("a*0", {"a": float("inf")}, "the value of 'a' is not finite"),
        ("a%7", {"a": 10**30}, "the value of 'a' is too large"),
        ("a+1", {"a": True}, "the value of 'a' is not a real number"),
        ("a+1", {"a": "x"}, "the value of 'a' is not a real number"),
    ],
)
def test_hostile_expressions_are_refused(
    expression: str, names: dict[str, object] | None, match: str
) -> None:
    with pytest.raises(CalculationError, match=match):
        evaluate(expression, names)  # type: ignore[arg-type]


def test_nesting_up_to_the_limit_is_fine() -> None:
    assert MAX_NESTING == 100
    assert evaluate("-" * (MAX_NESTING - 1) + "1") == -1
    assert evaluate("1+(" * 99 + "1" + ")" * 99) == 100
    with pytest.raises(CalculationError, match="nested"):
        evaluate("1+(" * 100 + "1" + ")" * 100)
    assert evaluate("1+" * 499 + "1") == 500  # long, not nested
    assert evaluate("((((((1))))))") == 1  # parentheses alone nest nothing


def test_a_deep_stack_gets_a_calculation_error_not_a_recursion_error() -> None:
    # A worker calls the calculator some frames deep; a parser or evaluator running out
    # of stack must still answer with one CalculationError.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 40)
    try:
        with pytest.raises(CalculationError, match="nested"):
            evaluate("-" * 900 + "1")
        with pytest.raises(CalculationError, match="nested"):
            evaluate("1+" * 499 + "1")
    finally:
        sys.setrecursionlimit(limit)


def test_checking_and_evaluating_a_tree_use_no_recursion() -> None:
    # Deeper than the recursion limit: only iteration gets through it. (Texts cannot
    # build such trees, being at most 1000 characters; this proves the method.)
    depth = sys.getrecursionlimit() * 5
    tree: ast.expr = ast.Constant(1)
    for _ in range(depth):
        tree = ast.BinOp(left=tree, op=ast.Add(), right=ast.Constant(1))
    assert calculator._run(calculator._program(tree), {}) == depth + 1
