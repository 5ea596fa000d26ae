"""The A2A request handler: each JSON-RPC method on the client and the event log.

The SDK's ``JsonRpcDispatcher`` parses the JSON-RPC envelope, checks the protocol
version and streams answers; this handler is the projection behind it (no task store,
no executor of its own: a task is a turn). ``SendMessage`` sends the message (its
``messageId`` is the idempotency key) and, unless ``returnImmediately``, waits for the
turn; a message naming a task that waits on an approval decides it (a data part
``{"approve": bool, "note"?}`` or the text yes or no) and the turn goes on.
``SendStreamingMessage`` and ``SubscribeToTask`` follow the turn in the event log.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import anyio
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from state.errors import BadInputError, NotFoundError, SessionOwnershipError
from state.ids import validate_id
from state.sessions.snapshot import InboxState
from tasks.server.protocols import turns
from tasks.server.protocols.a2a import push
from tasks.server.protocols.a2a import tasks as a2a_tasks
from tasks.server.protocols.a2a.stream import TurnStream
from tasks.server.protocols.a2a.tasks import Door
from tasks.server.protocols.agents import acting_user

logger = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")
_YES = frozenset({"yes", "y", "approve", "approved", "ok", "okay", "sure"})
_NO = frozenset({"no", "n", "reject", "rejected", "deny", "denied"})
MAX_PAGE = 100


def _translated(exc: Exception) -> A2AError:
    """The A2A error an exception answers as: another user's object or an unknown id is
    not found, bad input invalid params; anything else an internal error that says
    nothing of itself (the log has it)."""
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, NotFoundError | SessionOwnershipError):
        return TaskNotFoundError(message=str(exc))
    if isinstance(exc, BadInputError):
        return InvalidParamsError(message=str(exc))
    logger.error("A2A call failed", exc_info=exc)
    return InternalError(message="internal error (see the server's log)")


def guarded(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except Exception as exc:
            raise _translated(exc) from None

    return call


def guarded_stream(
    method: Callable[P, AsyncGenerator[Event]],
) -> Callable[P, AsyncGenerator[Event]]:
    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Event]:
        inner = method(*args, **kwargs)
        try:
            async for event in inner:
                yield event
        except Exception as exc:
            raise _translated(exc) from None
        finally:
            await inner.aclose()

    return call


def door_of(context: ServerCallContext) -> Door:
    door: Door = context.state["agentstate.door"]
    return door


def _text_of(message: pb.Message) -> str:
    texts = [part.text for part in message.parts if part.HasField("text")]
    if not texts:
        raise InvalidParamsError(message="the message has no text part")
    return "\n".join(texts)


def _decision(message: pb.Message) -> tuple[bool, str | None]:
    """The answer to an approval a message carries."""
    for part in message.parts:
        if part.HasField("data") and part.data.HasField("struct_value"):
            fields = part.data.struct_value.fields
            if "approve" in fields and fields["approve"].HasField("bool_value"):
                note = fields["note"].string_value if "note" in fields else None
                return fields["approve"].bool_value, note or None
    words = " ".join(part.text for part in message.parts if part.HasField("text"))
    said = words.strip().lower().rstrip(".!")
    if said in _YES:
        return True, None
    if said in _NO:
        return False, None
    raise InvalidParamsError(
        message='the task waits on an approval: answer with a data part {"approve": true|false} '
        "or the text yes or no"
    )


@dataclass(frozen=True)
class _Turn:
    """The turn behind a task, and where in its session's log to follow it from."""

    task_id: str
    session_id: str
    state: str | None  # its message's InboxState
    after: int

    @property
    def going(self) -> bool:
        return self.state in (InboxState.QUEUED, InboxState.STARTED)

    def items(self, door: Door) -> AsyncIterator[turns.TurnItem]:
        started = self.state == InboxState.STARTED
        return turns.watch(
            door.client,
            self.session_id,
            self.task_id,
            self.after,
            door.who.user_id,
            started=started,
        )


class AgentstateHandler(RequestHandler):
    """Every method of A2A 1.0's JSON-RPC binding but the extended card, on agentstate's
    client (see the module docstring; push notification configs in ``push``)."""

    @guarded
    async def on_message_send(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> Any:
        door = door_of(context)
        turn = await self._accept(door, params)
        if not params.configuration.return_immediately and turn.going:
            limit = door.settings.request_time_limit * 0.8
            with anyio.move_on_after(limit):  # past it: the task as it stands (working)
                async for item in turn.items(door):
                    del item
        return await a2a_tasks.load(door, turn.task_id)

    @guarded_stream
    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        door = door_of(context)
        turn = await self._accept(door, params)
        async for event in self._stream(door, turn):
            yield event

    @guarded_stream
    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        door = door_of(context)
        # The log's head before the task's state: a turn that starts in between is then
        # seen starting (the other way round, its start could fall before the head).
        record, _ = await a2a_tasks.record_of(door, params.id)
        found = await turns.head(door.engine, record["session_id"])
        record, _ = await a2a_tasks.record_of(door, params.id)
        task = await a2a_tasks.load(door, params.id)
        if task.status.state in a2a_tasks.TERMINAL:
            raise UnsupportedOperationError(
                message=f"task {params.id!r} is {pb.TaskState.Name(task.status.state)}: "
                "a finished task has no updates to subscribe to (GetTask reads it)"
            )
        turn = _Turn(params.id, record["session_id"], record["state"], found[0] if found else 0)
        async for event in self._stream(door, turn, first=task):
            yield event

    @guarded
    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> Any:
        return await a2a_tasks.load(door_of(context), params.id)

    @guarded
    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        door = door_of(context)
        from tasks.server.protocols.a2a.listing import list_tasks

        return await list_tasks(door, params, MAX_PAGE)

    @guarded
    async def on_cancel_task(self, params: pb.CancelTaskRequest, context: ServerCallContext) -> Any:
        door = door_of(context)
        record, _ = await a2a_tasks.record_of(door, params.id)
        if record["state"] != InboxState.STARTED:
            state = "waiting for its turn" if record["state"] == InboxState.QUEUED else "finished"
            raise TaskNotCancelableError(message=f"task {params.id!r} is {state}")
        await door.client.cancel_turn(record["session_id"], user_id=door.who.user_id)
        return await a2a_tasks.load(door, params.id)

    @guarded
    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        return await push.create(door_of(context), params)

    @guarded
    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        return await push.get(door_of(context), params)

    @guarded
    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        return await push.listing(door_of(context), params)

    @guarded
    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await push.remove(door_of(context), params)

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        raise UnsupportedOperationError(message="this agent has no extended card")

    # -- the turn behind a task -------------------------------------------------------

    async def _accept(self, door: Door, params: pb.SendMessageRequest) -> _Turn:
        """Send the message, or decide the approval it answers: the task id, whether its
        turn has begun, and the log's head before (where following starts)."""
        message = params.message
        if message.task_id:
            return await self._answer(door, message)
        context_id = message.context_id or f"ctx-{uuid.uuid4().hex}"
        try:
            session_id = validate_id(context_id, "context (session)")
            found = await turns.head(door.engine, session_id)
            owner = found[1] if found is not None else None
            if owner is not None and door.who.user_id not in (None, owner):
                raise TaskNotFoundError(message=f"unknown context {context_id!r}")
            named = a2a_tasks.metadata_of(params.metadata).get("user_id")
            user = acting_user(door.who, owner, named)
            task_id = await door.client.send_message(
                session_id,
                _text_of(message),
                user_id=user,
                idempotency_key=f"a2a:{message.message_id}"[:255],
                agent=door.agent,
            )
        except SessionOwnershipError:
            raise TaskNotFoundError(message=f"unknown context {context_id!r}") from None
        except BadInputError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        state = await turns.message_state(door.engine, session_id, task_id)
        return _Turn(task_id, session_id, state, found[0] if found is not None else 0)

    async def _answer(self, door: Door, message: pb.Message) -> _Turn:
        record, _ = await a2a_tasks.record_of(door, message.task_id)
        approval = await a2a_tasks.pending_approval(door, record)
        if approval is None:
            raise InvalidParamsError(
                message=f"task {message.task_id!r} waits on no answer; send a new message "
                "(no taskId) to its context for the next task"
            )
        approve, note = _decision(message)
        found = await turns.head(door.engine, record["session_id"])
        user = acting_user(door.who, record["user_id"])
        try:
            await door.client.decide(
                approval["approval_id"], approve, user, note=note, user_id=door.who.user_id
            )
        except NotFoundError:
            raise TaskNotFoundError(message=f"unknown task {message.task_id!r}") from None
        except BadInputError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return _Turn(
            record["message_id"], record["session_id"], InboxState.STARTED, found[0] if found else 0
        )

    async def _stream(
        self, door: Door, turn: _Turn, first: pb.Task | None = None
    ) -> AsyncGenerator[Event]:
        task = first or await a2a_tasks.load(door, turn.task_id)
        yield task
        if task.status.state in a2a_tasks.TERMINAL or not turn.going:
            return
        stream = TurnStream(task)
        for event in stream.opening():
            yield event
        async for item in turn.items(door):
            for event in stream.take(item):
                yield event
        yield stream.final(await a2a_tasks.load(door, turn.task_id))
