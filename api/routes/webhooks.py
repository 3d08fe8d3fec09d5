"""/webhooks: endpoints a key registers for events, signed as Standard Webhooks prescribe, with
a delivery log and a test event. The work is in api.services.webhooks; delivery is the
dispatcher's (core.webhooks). See docs/api.md ("Webhooks")."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import AdminDep, CallerDep, ReaderDep, SessionDep, SettingsDep
from api.responses import NO_KEY, NOT_ADMIN, OVER_QUOTA, Responses, problem
from api.services import webhooks
from api.webhook_schemas import (
    DeliveryPage,
    DeliveryStateOut,
    PauseIn,
    TestEventSent,
    WebhookCreated,
    WebhookIn,
    WebhookList,
    WebhookOut,
    WebhookPatch,
)
from core.webhooks.endpoints import delete_endpoint

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
NO_ENDPOINT: Responses = {404: problem("No such webhook endpoint (or not yours).")}
ERRORS: Responses = {**NO_KEY, **NO_ENDPOINT}
BAD_URL: Responses = {
    422: problem("Invalid body, or a URL that is not http(s) or reaches an internal address.")
}
EndpointId = Annotated[uuid.UUID, "a webhook endpoint id"]


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    responses={**NO_KEY, **BAD_URL, **OVER_QUOTA},
    summary="Register a webhook endpoint",
    description="Events of the key's own jobs, sweeps and models of the types named are "
    "POSTed to `url`, signed (Standard Webhooks: `webhook-id`, `webhook-timestamp`, "
    "`webhook-signature`) with the `secret` this answer shows, once.",
)
def create_webhook(
    body: WebhookIn,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> WebhookCreated:
    endpoint = webhooks.create(session, settings, caller, body)
    response.headers["Location"] = f"/webhooks/{endpoint.id}"
    shown = webhooks.endpoint_out(endpoint).model_dump()
    return WebhookCreated(**shown, secret=endpoint.secret)


@router.get("", response_model=WebhookList, responses=NO_KEY, summary="The key's endpoints")
def get_webhooks(session: ReaderDep, caller: CallerDep) -> WebhookList:
    return webhooks.listing(session, caller)


@router.post(
    "/pause",
    response_model=DeliveryStateOut,
    responses={**NO_KEY, **NOT_ADMIN},
    summary="Pause every delivery (admin)",
    description="Every event is held, none lost, and none sent until POST /webhooks/resume; "
    "attempts under way end as they will. Paused already: unchanged.",
)
def pause_webhooks(
    session: SessionDep, caller: AdminDep, body: PauseIn | None = None
) -> DeliveryStateOut:
    return webhooks.pause(session, caller, body.reason if body else None)


@router.post(
    "/resume",
    response_model=DeliveryStateOut,
    responses={**NO_KEY, **NOT_ADMIN},
    summary="Resume delivery (admin)",
    description="What was held goes, each endpoint's oldest first.",
)
def resume_webhooks(session: SessionDep, _: AdminDep) -> DeliveryStateOut:
    return webhooks.resume(session)


@router.get("/{endpoint_id}", response_model=WebhookOut, responses=ERRORS, summary="One endpoint")
def get_webhook(endpoint_id: EndpointId, session: ReaderDep, caller: CallerDep) -> WebhookOut:
    return webhooks.endpoint_out(webhooks.visible_endpoint(session, caller, str(endpoint_id)))


@router.patch(
    "/{endpoint_id}",
    response_model=WebhookOut,
    responses={**ERRORS, **BAD_URL},
    summary="Change an endpoint's URL, events, description, or enable it again",
)
def patch_webhook(
    endpoint_id: EndpointId,
    patch: WebhookPatch,
    session: SessionDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> WebhookOut:
    endpoint = webhooks.change(session, settings, caller, str(endpoint_id), patch)
    return webhooks.endpoint_out(endpoint)


@router.delete(
    "/{endpoint_id}", status_code=204, responses=ERRORS, summary="Remove an endpoint and its log"
)
def delete_webhook(endpoint_id: EndpointId, session: SessionDep, caller: CallerDep) -> Response:
    endpoint = webhooks.visible_endpoint(session, caller, str(endpoint_id))
    delete_endpoint(session, endpoint_id=endpoint.id)
    session.commit()
    return Response(status_code=204)


@router.post(
    "/{endpoint_id}/test",
    status_code=202,
    response_model=TestEventSent,
    responses={**ERRORS, 409: problem("The endpoint is disabled or failing: enable it first.")},
    summary="Send a test event",
    description="A `webhook.test` event to this endpoint alone, signed and retried as every "
    "event is; follow it in the delivery log.",
)
def test_webhook(endpoint_id: EndpointId, session: SessionDep, caller: CallerDep) -> TestEventSent:
    event_id = webhooks.send_test(session, caller, str(endpoint_id))
    log = f"/webhooks/{endpoint_id}/deliveries"
    return TestEventSent(event_id=event_id, links={"deliveries": log})


@router.get(
    "/{endpoint_id}/deliveries",
    response_model=DeliveryPage,
    responses=ERRORS,
    summary="The endpoint's delivery log, newest first",
)
def get_deliveries(
    endpoint_id: EndpointId,
    session: ReaderDep,
    caller: CallerDep,
    cursor: Annotated[str | None, Query(max_length=20, pattern=r"^[0-9]+$")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> DeliveryPage:
    return webhooks.deliveries_page(session, caller, str(endpoint_id), cursor, limit)
