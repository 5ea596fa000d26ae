"""OpenTelemetry spans: one per phase and per step, all of a turn in the trace its
``send_message`` started (W3C ``traceparent`` in each task message's headers), sent
over OTLP/HTTP (protobuf) to AGENTSTATE's view of the standard OTEL_EXPORTER_OTLP_*
variables.

Off (AGENTSTATE_OTEL=false, the default) a task pays one check of a module global: no
import of the SDK, no context object, no header.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from config import Settings, get_settings
from state.errors import MissingDependencyError

logger = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
# Spans leave in batches this often (the SDK's default, 5 s, loses more when a pool
# child is replaced).
EXPORT_EVERY_MS = 1000

# (pid, tracer or None): decided on first use in each process.
_decided: tuple[int, Any] | None = None
_providers: list[Any] = []


def tracer(settings: Settings | None = None) -> Any:
    """This process's tracer, or None when tracing is off (decided on first use, from
    ``settings`` or the environment's)."""
    decided = _decided
    if decided is not None and decided[0] == os.getpid():
        return decided[1]
    return _decide(settings or get_settings())


def _decide(settings: Settings) -> Any:
    global _decided  # noqa: PLW0603 - one tracer provider per process
    found = None
    if settings.otel:
        found = _start(settings.otlp_traces_url)
    _decided = (os.getpid(), found)
    return found


def _start(url: str) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise MissingDependencyError(
            "AGENTSTATE_OTEL=true needs the otel extra: pip install 'agentstate-celery[otel]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": "agentstate"}))
    exporter = OTLPSpanExporter(endpoint=url)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_EVERY_MS))
    # Not the global provider: an app's own tracing setup stays its own.
    _providers.append(provider)
    return provider.get_tracer("agentstate")


def headers() -> dict[str, str] | None:
    """The headers carrying the current span's context to the task being sent (None
    when tracing is off or no span is current)."""
    if tracer() is None:
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier or None


def task_span(name: str, request: Any, **attributes: Any) -> AbstractContextManager[Any]:
    """A span for the task being run, child of the context its message carries."""
    found = tracer()
    if found is None:
        return nullcontext()
    return _span(found, name, _carried(request), attributes, consumer=True)


def client_span(
    name: str, settings: Settings | None = None, **attributes: Any
) -> AbstractContextManager[Any]:
    """A span in an app (``send_message``): a new trace, or a child of the app's own."""
    found = tracer(settings)
    if found is None:
        return nullcontext()
    return _span(found, name, None, attributes, consumer=False)


@contextmanager
def _span(
    found: Any, name: str, parent: Any, attributes: Mapping[str, Any], *, consumer: bool
) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    kind = SpanKind.CONSUMER if consumer else SpanKind.PRODUCER
    shown = {key: value for key, value in attributes.items() if value is not None}
    with found.start_as_current_span(
        name, context=parent, kind=kind, attributes=shown, record_exception=False
    ) as span:
        try:
            yield span
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def _carried(request: Any) -> Any:
    from opentelemetry.propagate import extract

    carrier = {key: value for key in TRACE_HEADERS if (value := request.get(key))}
    return extract(carrier) if carrier else None


def forget() -> None:
    """Decide again on next use (tests that change settings); spans not sent yet are
    sent first."""
    global _decided
    decided, _decided = _decided, None
    if decided is not None and decided[1] is not None:
        _providers.pop().shutdown()
