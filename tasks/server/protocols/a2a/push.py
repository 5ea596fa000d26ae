"""A2A push notification configs of a task (Create/Get/List/Delete
``TaskPushNotificationConfig``), kept by ``state.webhooks.pushes`` on the webhook outbox.
Another user's task, or an unknown one, answers as not found; so does an unknown config."""

from __future__ import annotations

import asyncio

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from state.errors import WebhookSpecError
from state.webhooks.pushes import PushConfig, PushStore
from tasks.server.protocols.a2a import tasks as a2a_tasks
from tasks.server.protocols.a2a.tasks import Door

MAX_PAGE = 100


def _store(door: Door) -> PushStore:
    return PushStore(door.engine, door.settings.max_webhooks_per_user)


def _shown(found: PushConfig) -> pb.TaskPushNotificationConfig:
    shown = pb.TaskPushNotificationConfig(
        id=found.config_id, task_id=found.task_id, url=found.url, token=found.token
    )
    if found.scheme:  # the scheme only: credentials are not given back
        shown.authentication.scheme = found.scheme
    return shown


async def create(
    door: Door, params: pb.TaskPushNotificationConfig
) -> pb.TaskPushNotificationConfig:
    record, _ = await a2a_tasks.record_of(door, params.task_id)
    auth = params.authentication
    try:
        made = await asyncio.to_thread(
            _store(door).put,
            record,
            params.url,
            config_id=params.id,
            token=params.token,
            scheme=auth.scheme,
            credentials=auth.credentials,
            allow_private=door.settings.webhook_allow_private,
        )
    except WebhookSpecError as exc:
        raise InvalidParamsError(message=str(exc)) from None
    return _shown(made)


async def get(
    door: Door, params: pb.GetTaskPushNotificationConfigRequest
) -> pb.TaskPushNotificationConfig:
    await a2a_tasks.record_of(door, params.task_id)
    found = await asyncio.to_thread(_store(door).get, params.task_id, params.id)
    if found is None:
        raise TaskNotFoundError(
            message=f"task {params.task_id!r} has no push notification config {params.id!r}"
        )
    return _shown(found)


async def listing(
    door: Door, params: pb.ListTaskPushNotificationConfigsRequest
) -> pb.ListTaskPushNotificationConfigsResponse:
    await a2a_tasks.record_of(door, params.task_id)
    size = params.page_size or MAX_PAGE
    if not 1 <= size <= MAX_PAGE:
        raise InvalidParamsError(message=f"pageSize must be 1 to {MAX_PAGE}")
    found = await asyncio.to_thread(
        _store(door).listing, params.task_id, params.page_token, size + 1
    )
    page = found[:size]
    more = page[-1].config_id if len(found) > size else ""
    return pb.ListTaskPushNotificationConfigsResponse(
        configs=[_shown(item) for item in page], next_page_token=more
    )


async def remove(door: Door, params: pb.DeleteTaskPushNotificationConfigRequest) -> None:
    await a2a_tasks.record_of(door, params.task_id)
    if not await asyncio.to_thread(_store(door).remove, params.task_id, params.id):
        raise TaskNotFoundError(
            message=f"task {params.task_id!r} has no push notification config {params.id!r}"
        )
