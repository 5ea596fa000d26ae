"""Example workflow actions: word counts, and a POST that is safe to retry.

Run workers with them (this folder on the path; docs/guides/actions.md):

    PYTHONPATH=examples AGENTSTATE_ACTION_MODULES=text_actions celery -A tasks worker

tests/e2e/test_examples.py runs them through a real worker.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from state.agent import quick
from state.errors import PermanentActionError
from tasks.actions import action

# --8<-- [start:word-count]
Document = dict[str, Any]


@action("word_count")
@quick  # no side effects, milliseconds: one commit per step, no claim
def word_count(inputs: Document, deps: Document, context: Document) -> Document:
    text = inputs.get("text")
    if not isinstance(text, str):
        # The same inputs would fail the same way: fail the step now, no retry.
        raise PermanentActionError(f"'text' must be a string, not {type(text).__name__}")
    return {"words": len(text.split())}


@action("total_words")
@quick
def total_words(inputs: Document, deps: Document, context: Document) -> Document:
    # deps holds each dependency's outputs by step id: {"intro": {"words": 3}, ...}
    return {"words": sum(outputs["words"] for outputs in deps.values())}


# --8<-- [end:word-count]


@action("post_json")
def post_json(inputs: Document, deps: Document, context: Document) -> Document:
    url = str(inputs.get("url", ""))
    if not url.startswith(("http://", "https://")):
        raise PermanentActionError(f"'url' must be an http(s) URL, not {url!r}")
    body = json.dumps({"body": inputs.get("body"), "deps": deps}).encode()
    request = urllib.request.Request(url, data=body, method="POST")  # noqa: S310 (checked)
    request.add_header("Content-Type", "application/json")
    key = context.get("idempotency_key")
    if key:  # when present: the same for every attempt of this step, so the receiver
        request.add_header("Idempotency-Key", key)  # can drop a repeat after a crash
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return {"status": response.status}
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500 and exc.code not in (408, 429):
            raise PermanentActionError(f"{url} refused the request: HTTP {exc.code}") from exc
        raise  # 5xx, 408, 429 and network errors: retried with backoff, up to max_retries
