"""Table lines that fit the operator's terminal: cut at its width with an ellipsis, so a
long id or argument never wraps a row onto the next line and breaks the columns. A pipe
or a file gets whole lines (a script reads every character)."""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Callable
from typing import TextIO

ELLIPSIS = "\u2026"


def _columns_of(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def fit(line: str, columns: int) -> str:
    """``line`` if it takes at most ``columns`` terminal columns, else cut to end in an
    ellipsis within them."""
    if sum(map(_columns_of, line)) <= columns:
        return line
    kept, used = [], 0
    for ch in line:
        used += _columns_of(ch)
        if used > columns - 1:
            break
        kept.append(ch)
    return "".join(kept) + ELLIPSIS


def terminal_columns(out: TextIO) -> int | None:
    """The width of the terminal ``out`` writes to; None when it is not a terminal."""
    try:
        if not out.isatty():
            return None
        return os.get_terminal_size(out.fileno()).columns or None
    except (OSError, ValueError, AttributeError):
        return None


def line_printer(out: TextIO | None = None) -> Callable[[str], None]:
    """``print`` for the rows of a table on ``out`` (stdout): each fits the terminal."""
    stream = out or sys.stdout
    columns = terminal_columns(stream)

    def show(line: str) -> None:
        print(line if columns is None else fit(line, columns), file=stream)

    return show
