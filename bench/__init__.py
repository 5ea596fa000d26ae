"""Benchmarks: agentstate side by side with bare Celery and LangGraph (`make bench`)."""
