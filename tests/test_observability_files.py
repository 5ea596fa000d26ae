"""The observability profile's files: Prometheus scrapes the port the workers serve
metrics on, and every dashboard query names a metric agentstate exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from tasks.observability import metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    metrics.Metrics(registry)
    registry.register(metrics.WaitingCollector(lambda: metrics.Waiting(0, 0, 0.0, 0)))
    text = generate_latest(registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def test_prometheus_scrapes_the_workers_metrics_port_and_the_api() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    port = int(compose["services"]["worker"]["environment"]["AGENTSTATE_METRICS_PORT"])
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["agentstate-worker"]["dns_sd_configs"][0]["port"] == port
    assert jobs["agentstate-worker"]["dns_sd_configs"][0]["names"] == ["worker"]
    assert jobs["agentstate-api"]["static_configs"][0]["targets"] == ["api:8000"]
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "agentstate.json").read_text())
    names = exported_names()
    # Histograms and counters are exported as families; queries name their series.
    series = names | {f"{n}_total" for n in names} | {f"{n}_bucket" for n in names}
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found = set(re.findall(r"agentstate_[a-z_]+", target["expr"]))
            assert found, target["expr"]
            used |= found
    assert used <= series, used - series
    for required in (
        "agentstate_turns_total",
        "agentstate_phase_seconds_bucket",
        "agentstate_steps_total",
        "agentstate_recoveries_total",
        "agentstate_inbox_depth",
        "agentstate_lock_wait_seconds_bucket",
        "agentstate_commits_refused_total",
        "agentstate_steps_waiting_fair_share",
        "agentstate_approvals_pending",
    ):
        assert required in used, required


def test_grafana_provisions_the_datasource_and_the_dashboard_folder() -> None:
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and datasource["uid"] == "prometheus"
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "agentstate.yml").read_text()
    )["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
