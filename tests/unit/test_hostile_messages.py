"""Hostile messages cost the reference agent almost nothing: reading one is linear in its
length, and what one message may compute or store is bounded."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from config import Settings, get_settings
from state.documents.codec import dumps
from tasks import agent, intent
from tests.unit.test_reference_agent import make_ctx, run_turn

MAX_BYTES = Settings().max_message_bytes  # 64 KiB, the largest message accepted
HANG_GUARD_S = 1.0  # what one classification may take; the work is milliseconds


def sized(unit: str, size: int, head: str = "", tail: str = "") -> str:
    """``head``, ``unit`` repeated, ``tail``: exactly ``size`` UTF-8 bytes, or just under
    where a repeated character would not fit whole."""
    room = size - len(head.encode()) - len(tail.encode())
    body = (unit * (room // len(unit.encode()) + 1)).encode()[:room].decode("utf-8", "ignore")
    return head + body + tail


PATHOLOGICAL: dict[str, Callable[[int], str]] = {
    # The three found in review: minutes each at 64 KiB before the rewrite.
    "digits": lambda n: sized("1", n),
    "open parentheses and spaces, then a number": lambda n: sized("( ", n, tail="1"),
    "remember with trailing spaces": lambda n: sized(" ", n, "remember that a", "x"),
    # Long runs of one character.
    "operators": lambda n: sized("+", n),
    "minus signs": lambda n: sized("-", n),
    "stars": lambda n: sized("*", n),
    "open parentheses": lambda n: sized("(", n),
    "close parentheses": lambda n: sized(")", n),
    "spaces": lambda n: sized(" ", n),
    "newlines": lambda n: sized("\n", n),
    # Runs that almost make an expression, and many that do.
    "an operator then a run of '( '": lambda n: sized(" (", n, "1+", "x"),
    "number then run of spaces": lambda n: sized(" ", n, "1", "."),
    "dotted numbers": lambda n: sized("1.", n),
    "number then parenthesis": lambda n: sized("1 (", n),
    "parenthesis then number": lambda n: sized("(1", n),
    "numbers and spaces": lambda n: sized("1 ", n),
    "negative numbers": lambda n: sized("-1", n),
    "dangling operators": lambda n: sized("1*-", n),
    "many sums": lambda n: sized("1+1 ", n),
    "one long sum": lambda n: sized("1+", n, tail="1"),
    "nested sums": lambda n: sized("((1)+(1)) (", n),
    "unicode digits and signs": lambda n: sized("\u0663\u00d7\u0664\u00f7 ", n),
    # The other patterns' runs.
    "remember then spaces": lambda n: sized(" ", n, "remember", "."),
    "remember that then spaces and dots": lambda n: sized(" \t.!", n, "remember that"),
    "please please please": lambda n: sized("please ", n),
    "what what what": lambda n: sized("what ", n),
    "what then spaces": lambda n: sized(" ", n, "what", "x"),
    "what do you then spaces": lambda n: sized(" ", n, "what do you", "x"),
    "mixed junk": lambda n: sized("1.2(-3 ** )x\u00f7 4 remember what ", n),
}


def _timed(
    fn: Callable[[], Any], repeat: int = 1, clock: Callable[[], float] = time.perf_counter
) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = clock()
        fn()
        best = min(best, clock() - started)
    return best


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_a_pathological_64k_message_is_classified_at_once(name: str) -> None:
    text = PATHOLOGICAL[name](MAX_BYTES)
    assert MAX_BYTES - 4 < len(text.encode()) <= MAX_BYTES
    elapsed = _timed(lambda: agent.classify(text))
    assert elapsed < HANG_GUARD_S, f"{name}: {elapsed:.3f} s"
    elapsed = _timed(lambda: agent.understanding(make_ctx("understanding", text)))
    assert elapsed < HANG_GUARD_S, f"{name}: understanding took {elapsed:.3f} s"


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_the_scanner_alone_is_fast_without_the_calculation_limit(name: str) -> None:
    # The limit stops the scan early on many expressions; without it, still no hang.
    text = PATHOLOGICAL[name](MAX_BYTES)
    elapsed = _timed(lambda: intent.arithmetic(text, limit=10**9))
    assert elapsed < HANG_GUARD_S, f"{name}: {elapsed:.3f} s"


SIZES = (16384, 65536)


def _classify_all(texts: list[str]) -> float:
    # This thread's CPU time: other processes on a loaded machine do not count.
    return sum(_timed(partial(agent.classify, text), 5, time.thread_time) for text in texts)


def test_classification_time_grows_linearly() -> None:
    # Quadruple the size: linear work takes about 4x as long, the old patterns took 16x.
    # Best of five per input, in CPU time, summed over all inputs.
    small, large = (_classify_all([make(size) for make in PATHOLOGICAL.values()]) for size in SIZES)
    print(f"\nclassify, all inputs: {SIZES[0] // 1024} KiB {small * 1e3:.1f} ms, ", end="")
    print(f"{SIZES[1] // 1024} KiB {large * 1e3:.1f} ms, ratio {large / small:.2f}")
    assert large / small < 10


# --- the same answers as the original patterns ------------------------------------------

# The reference agent's patterns before the linear rewrite: right, but quadratic on long
# runs, so they are only run here, on short inputs.
_OLD_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?remember\s+(?:that\s+)?(?P<fact>.+?)[\s.!]*$", re.I | re.S
)
_OLD_RECALL = re.compile(
    r"\bwhat\s+(?:do|did)\s+you\s+remember\b|\bwhat\s+have\s+you\s+remembered\b", re.I
)
_OLD_EXPRESSION = re.compile(
    r"[(\s]*-?\d+(?:\.\d+)?[)\s]*(?:(?:\*\*|[-+*/%^\u00d7\u00f7])[(\s]*-?\d+(?:\.\d+)?[)\s]*)+"
)


def _old_balanced(expression: str) -> str:
    expression = expression.strip()
    while expression.count("(") > expression.count(")") and expression.startswith("("):
        expression = expression[1:].strip()
    while expression.count(")") > expression.count("(") and expression.endswith(")"):
        expression = expression[:-1].strip()
    return expression


def old_classify(text: str) -> dict[str, Any]:
    remember = _OLD_REMEMBER.match(text)
    if remember:
        return {"kind": "remember", "fact": remember.group("fact").strip()}
    if _OLD_RECALL.search(text):
        return {"kind": "recall"}
    expressions = [_old_balanced(m.group(0)) for m in _OLD_EXPRESSION.finditer(text)]
    expressions = [e for e in expressions if e]
    if expressions:
        return {"kind": "calculate", "expressions": expressions}
    return {"kind": "chat"}


WORDS = [
    *"0129.-+*/%^()!?x\u00d7\u00f7\u0663\u00a0\t\n",
    "**",
    " ",
    "  ",
    "1.5",
    "12",
    "what",
    "do",
    "did",
    "you",
    "have",
    "remember",
    "remembered",
    "Remember",
    "that",
    "THAT",
    "please",
    "Please",
]


def _random_messages(seed: int, count: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 14)))


@pytest.mark.parametrize("seed", range(4))
def test_classify_agrees_with_the_original_patterns(seed: int) -> None:
    for text in _random_messages(seed, 5000):
        assert intent.classify(text, 10**9) == old_classify(text), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "remember ",  # one space and nothing after: not a request to remember
        "remember  ",  # two: the original made the fact a single space, stripped to ""
        "remember that ",
        "remember that  ",
        "remember that ...",
        "please remember   that   x  .!. ",
        "1.2.3+4",  # a failed number's fraction may start an expression
        "1(2+3)",
        "1+2 (3+4)",
        "((2+3)",
        "(2+3))*4)",
        "2 ** -3 - -4",
        "what is 1 + 2 \u00d7 3 \u00f7 4",
        "\u0663+\u0664",
        "what do  you\nremember",
        "WHAT HAVE YOU REMEMBERED",
    ],
)
def test_classify_agrees_on_edge_cases(text: str) -> None:
    assert intent.classify(text, 10**9) == old_classify(text)


# --- bounded work per message ------------------------------------------------------------


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Settings re-read from the environment, and restored afterwards."""
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def test_forty_kilobytes_of_sums_plan_no_workflow_and_say_why() -> None:
    results = run_turn("1+1 " * 9999)
    assert get_settings().max_calculations_per_message == 20
    assert results["understanding"].context["intent"] == {
        "kind": "too_many_calculations",
        "limit": 20,
    }
    assert results["planning"].pending_actions == []
    assert results["executing"].workflow is None
    assert results["executing"].tool_results == []
    reply = results["generating"].reply
    assert reply is not None
    assert "at most 20 expressions" in reply
    assert "none" in reply


def test_the_calculation_limit_is_inclusive_and_read_from_settings(
    limits: pytest.MonkeyPatch,
) -> None:
    limits.setenv("AGENTSTATE_MAX_CALCULATIONS_PER_MESSAGE", "3")
    three = agent.classify("1+1, 2+2, 3+3")
    assert three == {"kind": "calculate", "expressions": ["1+1", "2+2", "3+3"]}
    assert agent.classify("1+1, 2+2, 3+3, 4+4") == {"kind": "too_many_calculations", "limit": 3}
    reply = run_turn("1+1, 2+2, 3+3, 4+4")["generating"].reply
    assert reply is not None
    assert "at most 3 expressions" in reply


def test_planning_never_plans_beyond_the_limit_whoever_wrote_the_intent() -> None:
    intent_ = {"kind": "calculate", "expressions": ["1+1"] * 21}
    result = agent.planning(make_ctx("planning", context={"intent": intent_}))
    assert result.trigger == "plan_ready"
    assert result.pending_actions == []
    assert result.context["intent"] == {"kind": "too_many_calculations", "limit": 20}


def test_truncated_cuts_utf8_bytes_and_ends_in_an_ellipsis() -> None:
    assert agent.truncated("short", 64) == "short"
    assert agent.truncated("x" * 64, 64) == "x" * 64
    for unit in ("x", "\u00e9", "\u20ac", "\U0001f600"):
        text = unit * 100
        cut = agent.truncated(text, 64)
        assert len(cut.encode()) <= 64
        assert cut.endswith("\u2026")
        assert text.startswith(cut[:-1])
        assert len(cut.encode()) > 64 - 3 - 4  # no more cut than one split character


def test_a_long_reply_is_cut_to_max_reply_bytes() -> None:
    limit = get_settings().max_reply_bytes
    assert limit == 16384
    memories = [f"fact {i} " + "y" * 2000 for i in range(100)]
    results = run_turn("what do you remember?", user_state_reader=lambda: {"memories": memories})
    reply = results["generating"].reply
    assert reply is not None
    assert len(reply.encode()) <= limit
    assert reply.endswith("\u2026")
    assert reply.startswith("Here is what I remember: fact 0 ")


def test_the_reply_limit_is_read_from_settings(limits: pytest.MonkeyPatch) -> None:
    limits.setenv("AGENTSTATE_MAX_REPLY_BYTES", "100")
    reply = run_turn("remember that " + "z" * 500)["generating"].reply
    assert reply is not None
    assert len(reply.encode()) <= 100
    assert reply.startswith("Got it. I'll remember that zzz")


def _remember(state: dict[str, Any], message: str) -> dict[str, Any]:
    update = run_turn(message)["executing"].user_state
    return state if update is None else update(state)


def test_memory_keeps_the_latest_max_facts_and_forgets_the_oldest() -> None:
    assert get_settings().max_facts == 100
    state: dict[str, Any] = {"name": "Ann"}
    for i in range(150):
        state = _remember(state, f"remember that fact number {i}")
    assert state["name"] == "Ann"
    assert state["memories"] == [f"fact number {i}" for i in range(50, 150)]


def test_an_oversized_stored_memory_is_trimmed_by_the_next_fact(
    limits: pytest.MonkeyPatch,
) -> None:
    limits.setenv("AGENTSTATE_MAX_FACTS", "3")
    state = _remember({"memories": ["a", "b", "c", "d", "e"]}, "remember that f")
    assert state == {"memories": ["d", "e", "f"]}
    stored = {"memories": list("abcde")}
    recall = run_turn("what do you remember?", user_state_reader=lambda: stored)
    assert recall["retrieving"].context == {"memories": ["c", "d", "e"]}


def test_a_fact_over_max_fact_bytes_is_refused_with_a_reason_and_stores_nothing() -> None:
    limit = get_settings().max_fact_bytes
    assert limit == 2048
    results = run_turn("remember that " + "\u00e9" * 1025)  # 2,050 bytes
    assert results["executing"].user_state is None
    [result] = results["executing"].tool_results or []
    assert result["ok"] is False
    assert "fact" not in result  # the refused text is not copied into the session again
    reply = results["generating"].reply
    assert reply is not None
    assert reply.startswith("Sorry, I can't remember that")
    assert "2048" in reply
    fits = run_turn("remember that " + "\u00e9" * 1024)["executing"].user_state
    assert fits is not None
    assert fits({}) == {"memories": ["\u00e9" * 1024]}


def test_150_large_facts_make_a_small_user_state() -> None:
    # Review: "remember that" 150 times x 60 KB made a 9.1 MB user state.
    state: dict[str, Any] = {}
    for i in range(150):
        state = _remember(state, f"remember that {i} " + "w" * 60_000)
        state = _remember(state, f"remember that {i} " + "v" * 2_000)
    assert len(state["memories"]) == 100
    assert len(dumps(state)) < 100 * 2048 + 4096


@pytest.mark.parametrize("memories", [5, "abc", None, {"a": 1}, [1, None, "kept"]])
def test_recall_and_remember_survive_a_memories_field_of_any_shape(memories: object) -> None:
    stored = {"memories": memories}
    recall = run_turn("what do you remember?", user_state_reader=lambda: stored)
    expected = ["kept"] if isinstance(memories, list) else []
    assert recall["retrieving"].context == {"memories": expected}
    assert _remember(dict(stored), "remember that x") == {"memories": [*expected, "x"]}
