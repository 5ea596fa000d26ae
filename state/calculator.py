"""Safe arithmetic: the calculator tool and the ``calculate`` action (no ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping

from state.errors import CalculationError

__all__ = ["MAX_MAGNITUDE", "CalculationError", "evaluate", "format_number"]

Number = int | float
MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 2**63 - 1  # results are stored as JSON numbers (64-bit)

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_SYNONYMS = {"^": "**", "\u00d7": "*", "\u00f7": "/"}  # also the x and division signs


def evaluate(expression: str, names: Mapping[str, Number] | None = None) -> Number:
    """The value of an arithmetic expression; names stand for the given numbers."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculationError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    for symbol, python in _SYNONYMS.items():
        expression = expression.replace(symbol, python)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"not an arithmetic expression: {expression!r}") from exc
    return _checked(_eval(tree.body, names or {}))


def _eval(node: ast.AST, names: Mapping[str, Number]) -> Number:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise CalculationError("booleans are not numbers here")
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise CalculationError(f"unknown name {node.id!r}")
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, names))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, names), _eval(node.right, names)
        return _apply(node.op, left, right)
    raise CalculationError(f"unsupported element {type(node).__name__} in expression")


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise CalculationError(f"exponent larger than {MAX_EXPONENT}")
    try:
        return _checked(_BINARY[type(op)](left, right))
    except ZeroDivisionError as exc:
        raise CalculationError("division by zero") from exc
    except OverflowError as exc:
        raise CalculationError("result is too large") from exc


def _checked(value: Number) -> Number:
    if isinstance(value, complex) or not _is_number(value):
        raise CalculationError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError("result is too large")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_number(value: Number) -> str:
    """84 rather than 84.0; floats to 12 significant digits."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)
