"""A turn's items as A2A stream events: ``working`` once the turn begins, the reply as
updates of its one text artifact (each streamed chunk appended, the stored reply's rest
closing it), and the task's final status once the turn ends or waits on an approval."""

from __future__ import annotations

from a2a.server.events.event_queue import Event
from a2a.types import a2a_pb2 as pb

from tasks.server.protocols import turns
from tasks.server.protocols.a2a.tasks import REPLY_ARTIFACT, artifact_id, text_part


class TurnStream:
    """What one task's followers are sent, item by item."""

    def __init__(self, task: pb.Task) -> None:
        self.task_id = task.id
        self.running = task.status.state == pb.TASK_STATE_WORKING
        self.context_id = task.context_id
        self.working = False
        self.sent = ""
        self.closed = False

    def opening(self) -> list[Event]:
        """What follows the task at once: ``working`` when its turn has begun already (a
        follower always sees its task go to work, however late it came)."""
        return self.take(turns.StepStarted("")) if self.running else []

    def take(self, item: turns.TurnItem) -> list[Event]:
        if isinstance(item, turns.StepStarted) and not self.working:
            self.working = True
            status = pb.TaskStatus(state=pb.TASK_STATE_WORKING)
            return [self._status(status)]
        if isinstance(item, turns.Chunk) and item.text and not self.closed:
            append = bool(self.sent)
            self.sent += item.text
            return [self._artifact(item.text, append=append, last=False)]
        if isinstance(item, turns.Reply) and not self.closed:
            self.closed = True
            if self.sent and item.text.startswith(self.sent):
                return [self._artifact(item.text[len(self.sent) :], append=True, last=True)]
            return [self._artifact(item.text, append=False, last=True)]
        return []

    def final(self, task: pb.Task) -> Event:
        """The last event: the task's status as stored once the turn ended or parked."""
        return self._status(task.status)

    def _status(self, status: pb.TaskStatus) -> pb.TaskStatusUpdateEvent:
        return pb.TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )

    def _artifact(self, text: str, *, append: bool, last: bool) -> pb.TaskArtifactUpdateEvent:
        artifact = pb.Artifact(
            artifact_id=artifact_id(self.task_id), name=REPLY_ARTIFACT, parts=[text_part(text)]
        )
        return pb.TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            artifact=artifact,
            append=append,
            last_chunk=last,
        )
