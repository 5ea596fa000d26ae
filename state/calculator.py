"""Safe arithmetic: the calculator tool and the ``calculate`` action (no ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping

from state.errors import CalculationError

__all__ = ["MAX_MAGNITUDE", "MAX_NESTING", "evaluate", "format_number"]

Number = int | float
MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 2**63 - 1  # results are stored as JSON numbers (64-bit)
# Operators inside another's right operand or sign: 2*(3-(4+...)), ---1, 2**3**4.
# Left operands do not count: 1+2+3+... is a long expression, not a nested one.
MAX_NESTING = 100

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
    """The value of an arithmetic expression; names stand for the given numbers.

    Every number in it, every name's value and every intermediate result must be
    finite, integers and results at most MAX_MAGNITUDE; exponents at most MAX_EXPONENT;
    nesting at most MAX_NESTING levels. The tree is checked and evaluated without
    recursion; only Python's parser recurses, as deep as 1000 characters allow.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalculationError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    for symbol, python in _SYNONYMS.items():
        expression = expression.replace(symbol, python)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalculationError(f"not an arithmetic expression: {expression!r}") from exc
    except (RecursionError, MemoryError) as exc:  # the parser's limits, on a deep stack
        raise CalculationError("expression is too deeply nested to parse") from exc
    return _checked(_run(_program(tree.body), names or {}))


def _program(root: ast.expr) -> list[ast.expr]:
    # The nodes in evaluation order, operands before their operator, each checked first.
    order: list[ast.expr] = []
    pending: list[tuple[ast.expr, int]] = [(root, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_NESTING:
            raise CalculationError(f"expression is nested more than {MAX_NESTING} levels deep")
        order.append(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            pending.append((node.left, depth))
            pending.append((node.right, depth + 1))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            pending.append((node.operand, depth + 1))
        else:
            _check_leaf(node)
    order.reverse()
    return order


def _check_leaf(node: ast.expr) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        raise CalculationError("booleans are not numbers here")
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        _operand(node.value, "a number in the expression")
    elif not isinstance(node, ast.Name):
        raise CalculationError(f"unsupported element {type(node).__name__} in expression")


def _run(order: list[ast.expr], names: Mapping[str, Number]) -> Number:
    stack: list[Number] = []
    for node in order:
        if isinstance(node, ast.BinOp):
            right = stack.pop()
            stack.append(_apply(node.op, stack.pop(), right))
        elif isinstance(node, ast.UnaryOp):
            stack.append(_UNARY[type(node.op)](stack.pop()))
        elif isinstance(node, ast.Name):
            stack.append(_named(node.id, names))
        elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            stack.append(node.value)
    return stack.pop()


def _named(name: str, names: Mapping[str, Number]) -> Number:
    if name not in names:
        raise CalculationError(f"unknown name {name!r}")
    return _operand(names[name], f"the value of {name!r}")


def _operand(value: Number, what: str) -> Number:
    # A float costs the same whatever its size (and 1e308*10 is refused as not finite);
    # an int costs its size, so huge ones never reach an operator: "1e999" is inf, and
    # 10**999 written out would make (10**999)**1000 a 3-million-bit power.
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculationError(f"{what} is not finite")
        return value
    return _checked(value, what)


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise CalculationError(f"exponent larger than {MAX_EXPONENT}")
    try:
        return _checked(_BINARY[type(op)](left, right))
    except ZeroDivisionError as exc:
        raise CalculationError("division by zero") from exc
    except OverflowError as exc:
        raise CalculationError("result is too large") from exc


def _checked(value: Number, what: str = "result") -> Number:
    if isinstance(value, complex) or not _is_number(value):
        raise CalculationError(f"{what} is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError(f"{what} is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError(f"{what} is too large")
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
