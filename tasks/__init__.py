"""Celery side of agentstate: the app (``celery -A tasks worker``), thin tasks, the
reference agent, workflow actions, the client API and the CLI."""

from tasks.shadowing import check_packages

check_packages()  # before `config` and `state` are imported: an app module may hide them

from tasks.app import app  # noqa: E402

__all__ = ["app"]
