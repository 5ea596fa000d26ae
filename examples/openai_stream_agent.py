"""An agent that answers through an OpenAI-compatible chat model, streaming its words.

``generating`` asks the model's ``/chat/completions`` endpoint with ``"stream": true`` and
passes each piece of text to ``ctx.stream`` as it arrives, so followers of the session
(``AgentClient.events(..., follow=True, tokens=True)``, ``agentstate send --wait``) see
the answer being written; the whole text becomes the reply, committed with the phase.
Any server that speaks the protocol works (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM).

Run it (the standard library is the only HTTP client it needs)::

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sk-... OPENAI_MODEL=my-model \\
    PYTHONPATH=examples AGENTSTATE_AGENT=openai_stream_agent celery -A tasks worker

Keep ``OPENAI_TIMEOUT_S`` below AGENTSTATE_PHASE_TIME_LIMIT (10 s by default): a handler
past that limit ends its turn with an apology.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from state.agent import PhaseContext, PhaseResult

HISTORY_ITEMS = 10  # earlier messages sent with the question, for context


class ModelSettings(BaseSettings):
    """Where the model is (this app's own settings, read from OPENAI_* variables)."""

    model_config = SettingsConfigDict(env_prefix="OPENAI_")

    base_url: str = "https://api.openai.com/v1"
    api_key: str = ""
    model: str = "gpt-4o-mini"
    timeout_s: float = 8.0

    @field_validator("base_url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("OPENAI_BASE_URL must be an http:// or https:// URL")
        return value


def generating(ctx: PhaseContext) -> PhaseResult:
    """Stream the model's answer to the followers, then reply with all of it."""
    settings = ModelSettings()
    history = [
        {"role": item["role"], "content": item["content"]}
        for item in ctx.recent_messages(HISTORY_ITEMS)
    ]
    if not history or history[-1]["content"] != ctx.message:
        history.append({"role": "user", "content": ctx.message})
    words = []
    for piece in stream_chat(settings, history):
        ctx.stream(piece)  # followers see it now; nothing is written to the database
        words.append(piece)
    return PhaseResult("response_sent", reply="".join(words))


def stream_chat(settings: ModelSettings, messages: list[dict[str, str]]) -> Iterator[str]:
    """The pieces of the model's answer, as its server sends them (server-sent events)."""
    body = json.dumps({"model": settings.model, "messages": messages, "stream": True})
    request = urllib.request.Request(  # noqa: S310 (http or https: ModelSettings checks)
        settings.base_url.rstrip("/") + "/chat/completions",
        data=body.encode("utf-8"),
        headers={
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Authorization": f"Bearer {settings.api_key}",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=settings.timeout_s) as response:  # noqa: S310
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            piece = _content(json.loads(data))
            if piece:
                yield piece


def _content(event: dict[str, Any]) -> str:
    """The text of one streamed completion event (empty for role or finish events)."""
    choices = event.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    content = delta.get("content")
    return content if isinstance(content, str) else ""
