"""What operators see, through real workers: the Prometheus scrape counts turns, steps,
a recovery and a refused stale commit; the spans of one turn share one trace at an OTLP
receiver; Flower lists a failed step and an apology turn as FAILURE; a raising
handler's traceback is in the worker log at Celery's default level."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from config import Settings
from state.dispatch import RecordingDispatcher
from state.storage.backend import Backend
from state.turns.services import TurnServices
from tasks.actions import known_actions
from tasks.app import make_app
from tasks.client import AgentClient, AsyncAgentClient
from tasks.observability import tracing
from tasks.worker.processes import Flower, free_port
from tests.support import (
    PG_SERVER,
    REPO,
    TEST_DB,
    Workers,
    drop_database,
    make_settings,
    recreate_database,
    settings_env,
    uid,
)

pytestmark = pytest.mark.workers
AUTH = "tester:s3cret"
STUCK_AFTER_S = 2.0


class OtlpReceiver:
    """A tiny OTLP/HTTP (protobuf) traces receiver on a free loopback port."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def obs_db(pg_template: str) -> Iterator[str]:
    """A database of the module's own: the sweep its test runs recovers the whole
    database, so work other tests left behind would add to the counts."""
    name = f"{TEST_DB}_observability"
    recreate_database(name, template=pg_template)
    url = f"{PG_SERVER}/{name}"
    engine = Backend.build(make_settings(url)).engine
    yield url
    engine.dispose()
    drop_database(name)


@pytest.fixture(scope="module")
def obs_settings(obs_db: str, receiver: OtlpReceiver) -> Settings:
    return make_settings(
        obs_db,
        queue=uid("q"),
        agent="tests.agents",
        action_modules="tests.actions_for_tests",
        phase_time_limit=1.0,
        stuck_after=STUCK_AFTER_S,
        retry_backoff=0.05,
        metrics_port=free_port(),
        metrics_addr="127.0.0.1",
        otel=True,
        otlp_traces_endpoint=receiver.url,
    )


@pytest.fixture(scope="module")
def workers(obs_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    # One worker (one metrics port) with two pool children whose counts must add up, at
    # Celery's default log level (WARNING).
    pool = Workers(
        obs_settings, tmp_path_factory.mktemp("obs"), count=1, concurrency=2, loglevel="WARNING"
    ).start()
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def client(obs_settings: Settings, workers: Workers) -> Iterator[AgentClient]:
    tracing.forget()
    yield AgentClient(obs_settings)
    tracing.forget()


@pytest.fixture(scope="module")
def flower(obs_settings: Settings, workers: Workers) -> Iterator[str]:
    server = Flower(
        obs_settings, free_port(), cwd=REPO, env=settings_env(obs_settings), basic_auth=AUTH
    )
    if not server.wait_ready():
        server.stop()
        pytest.fail("Flower did not come up")
    time.sleep(1.0)  # subscribed to events before the work starts
    yield server.url
    server.stop()


def scrape(settings: Settings) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _run(client: AgentClient, text: str) -> dict[str, Any]:
    session_id = uid("s")
    client.send_message(session_id, text, user_id=uid("u"))
    return client.wait_for_idle(session_id, timeout=30)


def _services(settings: Settings) -> TurnServices:
    return TurnServices.build(Backend.build(settings), RecordingDispatcher(), known_actions)


def test_the_scrape_counts_turns_steps_a_recovery_and_a_refused_commit(
    client: AgentClient, obs_settings: Settings
) -> None:
    before = scrape(obs_settings)
    for n in range(3):
        assert (
            _run(client, f"what is {n}+1?")["message_history"][-1]["content"] == f"{n}+1 = {n + 1}"
        )
    _run(client, "please explode")  # an apology
    # The late handler's commit is refused: the watchdog ended its turn first.
    _run(client, "ponder 2*2")
    spec = {
        "steps": [
            {"step_id": "a", "action": "echo", "inputs": {"x": 1}},
            {"step_id": "b", "action": "echo", "inputs": {}, "dependencies": ["a"]},
            {"step_id": "c", "action": "fail", "inputs": {"message": "no"}, "max_retries": 0},
        ]
    }
    workflow_id = client.start_workflow(spec)
    assert client.wait_for_workflow(workflow_id, timeout=30)["status"] == "failed"
    # A message whose kick was lost: the sweep (run by the worker) starts its turn.
    lost = uid("s")
    _services(obs_settings).inbox.accept(lost, uid("u"), "what is 4*4?")
    time.sleep(STUCK_AFTER_S + 0.5)
    make_app(obs_settings).send_task("agentstate.recovery.sweep")
    doc = client.wait_for_idle(lost, timeout=30)
    assert doc["message_history"][-1]["content"] == "4*4 = 16"
    time.sleep(3.5)  # the ponderer's late commit, refused
    after = scrape(obs_settings)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("agentstate_turns_total", outcome="replied") == 4  # 3 sums, the recovered one
    assert delta("agentstate_turns_total", outcome="failed") == 2  # explode, ponder
    assert delta("agentstate_steps_total", status="success") == 2
    assert delta("agentstate_steps_total", status="failed") == 1
    assert delta("agentstate_recoveries_total") == 1
    assert delta("agentstate_sweeps_total") == 1
    assert delta("agentstate_sweep_items_total", action="turns_started") == 1
    assert delta("agentstate_commits_refused_total", kind="session") >= 1
    # Each turn ran understanding once (the recovered one too).
    assert delta("agentstate_phase_seconds_count", phase="understanding") == 6
    assert delta("agentstate_lock_wait_seconds_count") >= 6
    for gauge in (
        "agentstate_inbox_depth",
        "agentstate_approvals_pending",
        "agentstate_approval_oldest_age_seconds",
        "agentstate_steps_waiting_fair_share",
    ):
        assert (gauge, ()) in after, gauge
    assert value(after, "agentstate_inbox_depth") == 0


def test_the_spans_of_one_turn_share_one_trace(client: AgentClient, receiver: OtlpReceiver) -> None:
    session_id = uid("s")
    client.send_message(session_id, "what is 6*7?", user_id=uid("u"))
    client.wait_for_idle(session_id, timeout=30)
    assert_one_trace(receiver, session_id)


def test_an_asyncio_clients_message_starts_the_trace_too(
    client: AgentClient, obs_settings: Settings, receiver: OtlpReceiver
) -> None:
    session_id = uid("s")

    async def send() -> None:
        async with AsyncAgentClient(obs_settings) as aclient:
            await aclient.send_message(session_id, "what is 6*7?", user_id=uid("u"))
            await aclient.wait_for_idle(session_id, timeout=30)

    asyncio.run(send())
    assert_one_trace(receiver, session_id)


def assert_one_trace(receiver: OtlpReceiver, session_id: str) -> None:
    """The session's spans (send_message's and every phase's) are one trace, rooted at
    send_message."""
    phases = {"understanding", "planning", "retrieving", "executing", "evaluating", "generating"}
    deadline = time.monotonic() + 20
    ours: list[Any] = []
    while time.monotonic() < deadline:
        ours = [s for s in list(receiver.spans) if _attr(s, "agentstate.session_id") == session_id]
        names = {s.name for s in ours}
        if (
            "agentstate.send_message" in names
            and {f"agentstate.phase.{p}" for p in phases} <= names
        ):
            break
        time.sleep(0.3)
    names = {s.name for s in ours}
    assert "agentstate.send_message" in names, names
    assert {f"agentstate.phase.{p}" for p in phases} <= names, names
    assert len({s.trace_id for s in ours}) == 1
    root = next(s for s in ours if s.name == "agentstate.send_message")
    assert all(s.parent_span_id for s in ours if s is not root)


def _attr(span: Any, key: str) -> str | None:
    for attribute in span.attributes:
        if attribute.key == key:
            return str(attribute.value.string_value)
    return None


def _get(url: str) -> Any:
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(AUTH.encode()).decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


def test_flower_lists_a_failed_step_and_an_apology_turn_as_failure(
    client: AgentClient, flower: str
) -> None:
    session_id = uid("s")
    client.send_message(session_id, "please explode", user_id=uid("u"))
    client.wait_for_idle(session_id, timeout=30)
    spec = {
        "steps": [
            {"step_id": "f", "action": "fail", "inputs": {"message": "boom"}, "max_retries": 0}
        ]
    }
    workflow_id = client.start_workflow(spec)
    client.wait_for_workflow(workflow_id, timeout=30)
    deadline = time.monotonic() + 20
    turn: list[Any] = []
    step: list[Any] = []
    while time.monotonic() < deadline and not (turn and step):
        tasks = _get(f"{flower}/api/tasks?limit=5000&state=FAILURE").values()
        turn = [t for t in tasks if session_id in str(t.get("args"))]
        step = [t for t in tasks if workflow_id in str(t.get("args"))]
        time.sleep(0.3)
    assert turn and turn[0]["name"] == "agentstate.phase.planning", turn
    assert "exploded on purpose" in str(turn[0]["exception"])
    assert step and step[0]["name"] == "agentstate.workflow.step", step
    assert "boom" in str(step[0]["exception"])


def test_a_raising_handler_leaves_its_traceback_in_the_worker_log(
    client: AgentClient, workers: Workers
) -> None:
    _run(client, "please explode")
    logs = "\n".join(p.read_text(errors="replace") for p in Path(workers.log_dir).glob("*.log"))
    assert "Traceback (most recent call last)" in logs
    assert "RuntimeError: the planner exploded on purpose" in logs
    # An action's too (the failing steps of the tests above).
    assert "PermanentActionError: boom" in logs
    # The FSM's per-transition lines are DEBUG lines: not at this level.
    assert "Finished processing state" not in logs


def test_serve_exposes_metrics_and_writes_json_logs(
    client: AgentClient, obs_settings: Settings, tmp_path: Path
) -> None:
    from tests.api_support import read, serving

    waiting = uid("s")
    _services(obs_settings).inbox.accept(waiting, uid("u"), "queued, never kicked")
    settings = obs_settings.model_copy(update={"otel": False})
    with serving(settings, tmp_path, None, AGENTSTATE_LOG_FORMAT="json") as api:
        response = api.client().get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        assert families["agentstate_inbox_depth"].samples[0].value >= 1
        assert "agentstate_turns" in families  # the counters, registered at start
        log = read(api.log)
    lines = [line for line in log.splitlines() if line.startswith("{")]
    assert lines, log
    assert all(json.loads(line)["level"] for line in lines)


def _cancelled_mid_turn(client: AgentClient, cancel: Any) -> None:
    """Start a turn that waits for a person's approval (it runs until decided, however
    slow the cancel is to come), cancel it with ``cancel(session_id)``."""
    session_id = uid("s")
    client.send_message(session_id, "risky business", user_id=uid("u"))
    deadline = time.monotonic() + 30
    while (client.get_session(session_id) or {}).get("phase") != "awaiting_approval":
        assert time.monotonic() < deadline, "the turn never asked for approval"
        time.sleep(0.02)
    cancel(session_id)
    doc = client.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["metadata"]["kind"] == "cancelled"


def test_turns_cancelled_over_http_and_from_the_cli_are_counted(
    client: AgentClient, obs_settings: Settings, tmp_path: Path
) -> None:
    """A cancel commits in the process that asks for it: the service counts its own; the
    CLI's, which serves no metrics, is counted by the next endpoint scraped, once."""
    import subprocess
    import sys

    from tests.api_support import serving

    settings = obs_settings.model_copy(update={"otel": False})
    with serving(settings, tmp_path, None) as api:

        def served() -> float:
            text = api.client().get("/metrics").text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    cancelled = sample.labels == {"outcome": "cancelled"}
                    if sample.name == "agentstate_turns_total" and cancelled:
                        return sample.value
            return 0.0

        def cancelled() -> float:  # the fleet's count: the worker's endpoint and the service's
            return value(scrape(obs_settings), "agentstate_turns_total", outcome="cancelled")

        fleet_before, served_before = cancelled(), served()

        def over_http(session_id: str) -> None:
            answer = api.client().post(f"/v1/sessions/{session_id}/cancel")
            assert answer.status_code == 200, answer.text

        _cancelled_mid_turn(client, over_http)
        assert served() - served_before == 1

        def from_the_cli(session_id: str) -> None:
            result = subprocess.run(
                [sys.executable, "-m", "tasks.cli", "session", "cancel", session_id],
                env=settings_env(settings),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert result.returncode == 0, result.stderr

        _cancelled_mid_turn(client, from_the_cli)
        # Scraped once each, in either order: the CLI's cancel is counted by one of them.
        total = cancelled() - fleet_before + served() - served_before
        assert total == 2
        assert cancelled() - fleet_before + served() - served_before == 2  # not twice
