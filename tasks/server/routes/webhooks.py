"""Webhooks: URLs told about turns, approvals, workflows and schedule ticks, through an
outbox; every request signed per Standard Webhooks, retried with backoff, logged."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from state.errors import BadInputError
from tasks.server.context import Client, Who, listing_user
from tasks.server.models import ID_PATTERN
from tasks.server.models_automation import DeliveryOut, WebhookIn, WebhookOut

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
WebhookId = Annotated[str, Path(pattern=ID_PATTERN, description="a webhook id")]
DeliveryId = Annotated[str, Path(pattern=ID_PATTERN, description="a delivery (webhook-id)")]


@router.post(
    "",
    status_code=201,
    summary="Register a webhook",
    description="Answers the hook with its `secret` (`whsec_...`, shown this once): verify "
    "each request's `webhook-signature` with it. A URL resolving to a loopback, private or "
    "link-local address answers 400 unless AGENTSTATE_WEBHOOK_ALLOW_PRIVATE.",
)
async def add_webhook(*, body: WebhookIn, who: Who, client: Client) -> WebhookOut:
    if who.user_id is not None and body.user_id not in (None, who.user_id):
        raise BadInputError("user_id must be the key's own user")
    made = await client.add_webhook(
        body.url,
        body.events,
        user_id=who.user_id or body.user_id,
        secret=body.secret,
        session_id=body.session_id,
    )
    return WebhookOut.model_validate(made)


@router.get("", summary="List webhooks")
async def list_webhooks(
    *,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
) -> list[WebhookOut]:
    user, possible = listing_user(who, user_id)
    if not possible:
        return []
    return [WebhookOut.model_validate(h) for h in await client.list_webhooks(user_id=user)]


@router.delete("/{webhook_id}", status_code=204, summary="Remove a webhook and its deliveries")
async def remove_webhook(*, webhook_id: WebhookId, who: Who, client: Client) -> Response:
    await client.remove_webhook(webhook_id, user_id=who.user_id)
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", summary="A webhook's deliveries, newest first")
async def webhook_deliveries(
    *,
    webhook_id: WebhookId,
    who: Who,
    client: Client,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[DeliveryOut]:
    found = await client.webhook_deliveries(webhook_id, limit=limit, user_id=who.user_id)
    return [DeliveryOut.model_validate(d) for d in found]


@router.post(
    "/deliveries/{delivery_id}/redeliver",
    summary="Send a delivery again",
    description="A fresh set of attempts under the same `webhook-id`.",
)
async def redeliver(*, delivery_id: DeliveryId, who: Who, client: Client) -> DeliveryOut:
    return DeliveryOut.model_validate(await client.redeliver(delivery_id, user_id=who.user_id))
