"""Settings, log formats, the FSM's log level and the no-op paths of metrics and tracing
(no services needed)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from config import Settings, child_environment
from config.settings import LogFormat
from state import observe
from state.errors import ConfigurationError
from state.machine import AgentStateMachine
from state.turns.draft import PhaseOutcome
from state.workflows.calls import StepFailed
from tasks.observability import metrics, tracing
from tasks.observability.logs import JsonFormatter


def test_defaults_are_off() -> None:
    settings = Settings()
    assert settings.metrics_port == 0 and not settings.otel
    assert settings.log_format == LogFormat.TEXT
    assert settings.otlp_traces_url == "http://localhost:4318/v1/traces"


def test_the_standard_otlp_variables_are_read_and_handed_to_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert Settings().otlp_traces_url == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://x.example/traces")
    assert Settings().otlp_traces_url == "https://x.example/traces"
    env = child_environment(Settings(otlp_endpoint="http://other:4318"))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://other:4318"
    assert "AGENTSTATE_OTLP_ENDPOINT" not in env


@pytest.mark.parametrize("bad", [{"metrics_port": 70000}, {"metrics_port": -1}])
def test_a_bad_metrics_port_is_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="metrics_port"):
        Settings(**bad)  # type: ignore[arg-type]


def test_an_otlp_endpoint_that_is_not_http_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        Settings(otlp_endpoint="collector:4318")


def test_json_log_lines_carry_the_traceback() -> None:
    logger = logging.getLogger("test.json")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("on purpose")
        except RuntimeError:
            logger.warning("it failed: %s", "x", exc_info=True)
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["level"] == "WARNING" and line["message"] == "it failed: x"
    assert "RuntimeError: on purpose" in line["exception"]


@pytest.fixture
def transitions_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _transition() -> None:
    machine = AgentStateMachine("s-1", "idle")
    machine.receive_input()


def test_the_fsm_chatter_is_debug_only(transitions_log: io.StringIO) -> None:
    logging.getLogger().setLevel(logging.INFO)
    _transition()
    assert "Finished processing state" not in transitions_log.getvalue()
    logging.getLogger().setLevel(logging.DEBUG)
    _transition()
    assert "Finished processing state" in transitions_log.getvalue()


def test_off_metrics_and_tracing_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.MULTIPROC_VARIABLE, raising=False)
    monkeypatch.setattr(metrics, "_active", None)
    monkeypatch.setattr(observe, "current", observe.NullObserver())  # an app may have set one
    tracing.forget()
    assert metrics.active() is None
    assert tracing.tracer(Settings()) is None
    assert tracing.headers() is None
    with tracing.task_span("x", {}):
        pass
    assert isinstance(observe.current, observe.NullObserver)
    tracing.forget()


def test_an_outcome_knows_how_its_turn_ended() -> None:
    outcome = PhaseOutcome("s-1", "applied")
    outcome.note_turn([])
    assert outcome.turn is None and outcome.as_dict()["turn"] is None
    from state.events.log import reply_event
    from state.sessions.snapshot import NewEvent

    outcome.note_turn([NewEvent("turn_failed", {"detail": "boom"}), reply_event({})])
    assert (outcome.turn, outcome.error) == ("failed", "boom")
    failed = StepFailed("ValueError: no")
    assert failed == "failed" and failed.error == "ValueError: no"


def test_metrics_count_into_their_registry() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    counting = metrics.Metrics(registry)
    counting.phase_done("planning", 0.01, "replied")
    counting.step_done("success")
    counting.commit_refused("session")
    counting.swept({"turns_started": 2, "errors": 0}, 2)
    text = generate_latest(registry).decode()
    assert 'agentstate_turns_total{outcome="replied"} 1.0' in text
    assert 'agentstate_phase_seconds_count{phase="planning"} 1.0' in text
    assert 'agentstate_commits_refused_total{kind="session"} 1.0' in text
    assert "agentstate_recoveries_total 2.0" in text
    assert 'agentstate_sweep_items_total{action="turns_started"} 2.0' in text
