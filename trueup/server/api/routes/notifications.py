"""Notifications: webhook targets, routing rules, the delivery log and the dead letters.

Admins manage targets and rules (audited); operators list them and the delivery
log and may redeliver a dead delivery; discarding one is for admins. Nothing here
deletes a delivery or its log: a deleted target's row stays, renamed. A target's
signing secret is write-only: it is returned once, when the server generated it;
its secret header's value is never returned. Admins set the tenant's allowlist of
internal receivers (audited); operators read it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from trueup.model.reasons import ReasonCode
from trueup.server.api.context import Api, role
from trueup.server.api.records import (
    DeadLettersAnswer,
    DeliveriesAnswer,
    DeliveryMoved,
    RulesAnswer,
    ServiceRecord,
    TargetsAnswer,
)
from trueup.server.api.responses import NAME_PARAM, answers
from trueup.server.inputs import IdPath, Name, TargetName
from trueup.server.limits import (
    HEADER_NAME_LENGTH,
    HEADER_VALUE_LENGTH,
    NAME_LENGTH,
    SECRET_VALUE_LENGTH,
    URL_LENGTH,
)
from trueup.server.service import Principal
from trueup.server.service.notify.deliveries import STATES
from trueup.server.service.notify.events import KINDS, SEVERITIES
from trueup.server.service.notify.policy import ALLOWLIST_ENTRIES

__all__ = ["AllowlistSet", "AuthHeader", "RuleCreate", "RuleMatch", "TargetCreate", "register"]

DELIVERY_ID = IdPath
_SHORT = Annotated[str, Field(min_length=1, max_length=NAME_LENGTH)]


class AuthHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # An HTTP header name (RFC 9110 token); the value printable ASCII, no line breaks.
    name: str = Field(
        min_length=1, max_length=HEADER_NAME_LENGTH, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
    )
    value: str = Field(min_length=1, max_length=HEADER_VALUE_LENGTH, pattern=r"^[\x20-\x7e\t]+$")


class TargetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: TargetName
    url: str = Field(max_length=URL_LENGTH)
    # The HMAC key for X-Trueup-Signature; omitted, the server generates one.
    secret: str | None = Field(None, min_length=16, max_length=SECRET_VALUE_LENGTH)
    # A header sent with every delivery (a receiver's token); its value is sealed, never shown.
    auth_header: AuthHeader | None = None


class AllowlistSet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Networks (CIDRs) and host names of internal receivers; [] clears the list.
    entries: list[Annotated[str, Field(min_length=1, max_length=NAME_LENGTH)]] = Field(
        max_length=ALLOWLIST_ENTRIES
    )


class RuleMatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[_SHORT] = Field([], max_length=100, description="device name globs")
    # The service names the unknown value; the schema lists the known ones.
    reason_codes: list[_SHORT] = Field(
        [], max_length=20, json_schema_extra={"items": {"enum": [c.value for c in ReasonCode]}}
    )
    kinds: list[_SHORT] = Field([], max_length=20, json_schema_extra={"items": {"enum": [*KINDS]}})
    min_severity: str = Field("info", max_length=20, json_schema_extra={"enum": [*SEVERITIES]})


class RuleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    target: Name
    match: RuleMatch = RuleMatch()
    escalate_after: float | None = Field(None, gt=0, le=30 * 86400)


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    operator, admin = api.operator, api.admin
    base = "/api/v1/notifications"

    @app.get(f"{base}/targets", openapi_extra=role("operator"), responses=answers())
    def list_targets(p: Principal = operator) -> TargetsAnswer:
        return {
            "targets": [dict(t) for t in plane.notify_targets(p.tenant_id)],
            "allowlist": plane.notify_allowlist(p.tenant_id)["entries"],
        }

    @app.post(f"{base}/targets", status_code=201, openapi_extra=role("admin"), responses=answers())
    def create_target(body: TargetCreate, p: Principal = admin) -> ServiceRecord:
        header = (body.auth_header.name, body.auth_header.value) if body.auth_header else None
        made = plane.create_notify_target(
            p.tenant_id, body.name, body.url, body.secret, p.actor, auth_header=header
        )
        return dict(made)

    @app.get(f"{base}/allowlist", openapi_extra=role("operator"), responses=answers())
    def get_allowlist(p: Principal = operator) -> ServiceRecord:
        return dict(plane.notify_allowlist(p.tenant_id))

    @app.put(f"{base}/allowlist", openapi_extra=role("admin"), responses=answers())
    def set_allowlist(body: AllowlistSet, p: Principal = admin) -> ServiceRecord:
        return dict(plane.set_notify_allowlist(p.tenant_id, body.entries, p.actor))

    @app.delete(
        f"{base}/targets/{{name}}",
        status_code=204,
        openapi_extra=role("admin"),
        responses={204: {"description": "deleted (audited)"}, **answers(404)},
    )
    def delete_target(name: NAME_PARAM, p: Principal = admin) -> Response:
        plane.delete_notify_target(p.tenant_id, name, p.actor)
        return Response(status_code=204)

    @app.get(f"{base}/rules", openapi_extra=role("operator"), responses=answers())
    def list_rules(p: Principal = operator) -> RulesAnswer:
        return {"rules": [dict(r) for r in plane.notify_rules(p.tenant_id)]}

    @app.post(f"{base}/rules", status_code=201, openapi_extra=role("admin"), responses=answers(404))
    def create_rule(body: RuleCreate, p: Principal = admin) -> ServiceRecord:
        match = body.match.model_dump()
        rule = plane.create_notify_rule(
            p.tenant_id, body.name, body.target, match, body.escalate_after, p.actor
        )
        return dict(rule)

    @app.delete(
        f"{base}/rules/{{name}}",
        status_code=204,
        openapi_extra=role("admin"),
        responses={204: {"description": "deleted (audited)"}, **answers(404)},
    )
    def delete_rule(name: NAME_PARAM, p: Principal = admin) -> Response:
        plane.delete_notify_rule(p.tenant_id, name, p.actor)
        return Response(status_code=204)

    @app.get(f"{base}/deliveries", openapi_extra=role("operator"), responses=answers())
    def list_deliveries(
        state: str | None = Query(
            None,
            max_length=20,
            description="only deliveries in this state (422 for another)",
            json_schema_extra={"enum": [*STATES]},
        ),
        limit: int = Query(100, ge=1, le=1000),
        p: Principal = operator,
    ) -> DeliveriesAnswer:
        log = plane.notify_delivery_log(p.tenant_id, state=state, limit=limit)
        return {"deliveries": [dict(d) for d in log]}

    @app.get(f"{base}/dead-letters", openapi_extra=role("operator"), responses=answers())
    def list_dead_letters(
        limit: int = Query(100, ge=1, le=1000), p: Principal = operator
    ) -> DeadLettersAnswer:
        log = plane.notify_delivery_log(p.tenant_id, state="dead", limit=limit)
        return {"dead_letters": [dict(d) for d in log]}

    @app.post(
        f"{base}/dead-letters/{{delivery_id}}/redeliver",
        openapi_extra=role("operator"),
        responses={200: {"description": "queued again (audited)"}, **answers(404)},
    )
    def redeliver(delivery_id: DELIVERY_ID, p: Principal = operator) -> DeliveryMoved:
        plane.redeliver_notification(p.tenant_id, delivery_id, p.actor)
        plane.notifier.wake()
        return {"id": delivery_id, "state": "pending"}

    @app.post(
        f"{base}/dead-letters/{{delivery_id}}/discard",
        openapi_extra=role("admin"),
        responses={200: {"description": "discarded (audited); kept in the log"}, **answers(404)},
    )
    def discard(delivery_id: DELIVERY_ID, p: Principal = admin) -> DeliveryMoved:
        plane.discard_notification(p.tenant_id, delivery_id, p.actor)
        return {"id": delivery_id, "state": "discarded"}
