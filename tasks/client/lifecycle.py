"""The data lifecycle for apps and operators, mixed into ``tasks.client.AgentClient``:
erasing a user (``state.lifecycle.erase``) and one retention run to completion
(``state.lifecycle.retention``)."""

from __future__ import annotations

from config import Settings
from state.lifecycle.erase import erase_user
from state.storage.backend import Backend


class Lifecycle:
    """The erase-and-retain part of AgentClient (see the module docstring)."""

    settings: Settings
    backend: Backend

    def erase_user(self, user_id: str) -> dict[str, int]:
        """Delete every row and every Redis key of ``user_id``: their sessions and those
        sessions' forks, history, inbox, events, revisions, approvals, workflows and
        steps, the user's state. Returns the rows deleted per kind (``redis_keys``: the
        keys). Idempotent: erasing again deletes nothing and returns zeros. A turn of the
        user in flight cannot write anything back (its commit finds no session)."""
        return erase_user(
            self.backend.engine,
            self.backend.redis,
            user_id,
            pace=self.settings.maintenance_pace,
        )
