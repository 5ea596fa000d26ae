"""What operators see: Prometheus metrics (``metrics``), OpenTelemetry spans
(``tracing``), log formats (``logs``), and the per-task reports that feed them
(``report``). See docs/operations/observability.md."""
