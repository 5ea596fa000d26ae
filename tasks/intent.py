"""What the reference agent reads in a message, in time linear in its length.

A message is up to AGENTSTATE_MAX_MESSAGE_BYTES of anyone's text, so no pattern here may
backtrack over a run of input more than a bounded number of times. The rules are those
of the original patterns (kept as the reference in the unit tests):

- "remember": ``^\\s*(please\\s+)?remember\\s+(that\\s+)?FACT[\\s.!]*$``, case-insensitive;
- "recall": "what do/did you remember" or "what have you remembered";
- "forget": "forget everything" or "forget all" (the agent asks for approval first);
- arithmetic: each run of numbers joined by operators, with the
  parentheses and spaces around them, as ``re.finditer`` would find it.

The arithmetic scanner finds each candidate with possessive and atomic regexes, which
never backtrack, and after a failed candidate moves past the positions that must fail the
same way, so each character is examined a bounded number of times.
"""

from __future__ import annotations

import re

from state.documents.codec import Document

_REMEMBER_HEAD = re.compile(r"\s*+(?:please\s++)?+remember(\s++)", re.I)
_THAT = re.compile(r"that(\s++)", re.I)
_RECALL = re.compile(
    r"\bwhat\s++(?:do|did)\s++you\s++remember\b|\bwhat\s++have\s++you\s++remembered\b", re.I
)
_FORGET = re.compile(r"\bforget\s++(?:everything|all)\b", re.I)
# A number that starts an expression; group 1 is its fractional digits.
_OPERAND = re.compile(r"-?+\d++(?:\.(\d++))?+")
_TRAIL = re.compile(r"[)\s]*+")
_OPERATOR = r"(?>\*\*|[-+*/%^\u00d7\u00f7])"
_MORE_OPERANDS = re.compile(rf"(?:{_OPERATOR}[(\s]*+-?+\d++(?:\.\d++)?+[)\s]*+)++")


def classify(text: str, max_calculations: int) -> Document:
    """The intent of a message; more than ``max_calculations`` expressions is refused."""
    fact = remembered_fact(text)
    if fact is not None:
        return {"kind": "remember", "fact": fact}
    if _FORGET.search(text):
        return {"kind": "forget"}
    if _RECALL.search(text):
        return {"kind": "recall"}
    expressions = arithmetic(text, max_calculations + 1)
    if len(expressions) > max_calculations:
        return {"kind": "too_many_calculations", "limit": max_calculations}
    if expressions:
        return {"kind": "calculate", "expressions": expressions}
    return {"kind": "chat"}


def remembered_fact(text: str) -> str | None:
    """The X of "remember (that) X", or None when the message does not ask that."""
    head = _REMEMBER_HEAD.match(text)
    if head is None:
        return None
    that = _THAT.match(text, head.end())
    if that is not None:
        fact = _fact(text, that.end(), len(that.group(1)))
        if fact is not None:
            return fact
    return _fact(text, head.end(), len(head.group(1)))


def _fact(text: str, start: int, spaces_before: int) -> str | None:
    # The original lazy ``(?P<fact>.+?)[\s.!]*$``: at least one character, then as few
    # as leave only spaces, dots and exclamation marks. With nothing after the spaces,
    # the pattern backtracks one space into the fact when it had two or more to give.
    if start == len(text):
        return "" if spaces_before >= 2 else None
    end = len(text)
    while end > start + 1 and (text[end - 1].isspace() or text[end - 1] in ".!"):
        end -= 1
    return text[start:end].strip()


def arithmetic(text: str, limit: int) -> list[str]:
    """Up to ``limit`` arithmetic expressions in ``text``, in order, parentheses balanced."""
    found: list[str] = []
    pos = 0
    while len(found) < limit:
        operand = _OPERAND.search(text, pos)
        if operand is None:
            break
        start = _lead_start(text, operand.start(), pos)
        more = _MORE_OPERANDS.match(text, _trail_end(text, operand.end()))
        if more is not None:
            expression = _balanced(text, start, more.end())
            if expression:
                found.append(expression)
            pos = more.end()
        else:
            # Every start up to here reaches the same number and fails the same way,
            # except inside a fraction, whose digits may begin another number ("1.2.3+4").
            pos = operand.end() if operand.group(1) is None else operand.start(1)
    return found


def _trail_end(text: str, pos: int) -> int:
    # Past the ")" and spaces after a number (the pattern matches, if only emptily).
    trail = _TRAIL.match(text, pos)
    return pos if trail is None else trail.end()


def _lead_start(text: str, operand_at: int, floor: int) -> int:
    # Where the run of "(" and spaces before the number begins (not before ``floor``).
    start = operand_at
    while start > floor and (text[start - 1] == "(" or text[start - 1].isspace()):
        start -= 1
    return start


def _balanced(text: str, start: int, end: int) -> str:
    # The run may take a stray parenthesis from the surrounding prose; drop extras.
    start, end = _stripped(text, start, end)
    opens = text.count("(", start, end)
    closes = text.count(")", start, end)
    while opens > closes and start < end and text[start] == "(":
        start, end = _stripped(text, start + 1, end)
        opens -= 1
    while closes > opens and start < end and text[end - 1] == ")":
        start, end = _stripped(text, start, end - 1)
        closes -= 1
    return text[start:end]


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
