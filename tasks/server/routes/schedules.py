"""Schedules: a message or a workflow per tick of a cron expression or an interval, each tick
exactly once; pause, resume, delete, and the log of ticks."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from state.errors import BadInputError, NotFoundError
from state.ids import new_id
from tasks.server.context import Client, Who, listing_user
from tasks.server.models import ID_PATTERN
from tasks.server.models_automation import ScheduleIn, ScheduleOut, ScheduleRunOut

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
ScheduleId = Annotated[str, Path(pattern=ID_PATTERN, description="a schedule id")]


@router.post(
    "",
    status_code=201,
    summary="Create a schedule",
    description="Bad cron, an unknown timezone, both or neither of `cron` and `every_seconds` "
    "answer 400 with nothing stored. A `schedule_id` that is taken answers 409 (leave it out "
    "to have one minted). The same request again returns the schedule.",
)
async def create_schedule(*, body: ScheduleIn, who: Who, client: Client) -> ScheduleOut:
    user_id = who.user_id or body.user_id
    if user_id is None:
        raise BadInputError("an operator's schedule needs the user_id it runs as")
    if who.user_id is not None and body.user_id not in (None, who.user_id):
        raise BadInputError("user_id must be the key's own user")
    made = await client.create_schedule(
        body.schedule_id or new_id("sch"),
        body.cron,
        every_seconds=body.every_seconds,
        user_id=user_id,
        session_id=body.session_id,
        text=body.text,
        workflow=body.workflow,
        timezone=body.timezone,
        catch_up=body.catch_up,
        overlap=body.overlap,
        payload=body.payload,
    )
    return ScheduleOut.model_validate(made)


@router.get("", summary="List schedules with their next ticks")
async def list_schedules(
    *,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
) -> list[ScheduleOut]:
    user, possible = listing_user(who, user_id)
    if not possible:
        return []
    return [ScheduleOut.model_validate(s) for s in await client.list_schedules(user_id=user)]


@router.get("/{schedule_id}", summary="Read a schedule")
async def get_schedule(*, schedule_id: ScheduleId, who: Who, client: Client) -> ScheduleOut:
    found = await client.get_schedule(schedule_id, user_id=who.user_id)
    if found is None:
        raise NotFoundError(f"unknown schedule {schedule_id!r}")
    return ScheduleOut.model_validate(found)


@router.post("/{schedule_id}/pause", summary="Pause a schedule")
async def pause_schedule(*, schedule_id: ScheduleId, who: Who, client: Client) -> ScheduleOut:
    return ScheduleOut.model_validate(await client.pause_schedule(schedule_id, user_id=who.user_id))


@router.post(
    "/{schedule_id}/resume",
    summary="Resume a schedule",
    description="It ticks again from the first tick after now; the paused time is not caught up.",
)
async def resume_schedule(*, schedule_id: ScheduleId, who: Who, client: Client) -> ScheduleOut:
    doc = await client.resume_schedule(schedule_id, user_id=who.user_id)
    return ScheduleOut.model_validate(doc)


@router.delete("/{schedule_id}", status_code=204, summary="Delete a schedule and its ticks")
async def delete_schedule(*, schedule_id: ScheduleId, who: Who, client: Client) -> Response:
    await client.delete_schedule(schedule_id, user_id=who.user_id)
    return Response(status_code=204)


@router.get("/{schedule_id}/runs", summary="A schedule's ticks, newest first")
async def schedule_runs(
    *,
    schedule_id: ScheduleId,
    who: Who,
    client: Client,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[ScheduleRunOut]:
    runs = await client.schedule_runs(schedule_id, limit=limit, user_id=who.user_id)
    return [ScheduleRunOut.model_validate(r) for r in runs]
