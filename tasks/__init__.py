"""Celery side of agentstate: the app (``celery -A tasks worker``), thin tasks, the
reference agent, workflow actions, the client API and the CLI."""

from tasks.app import app

__all__ = ["app"]
