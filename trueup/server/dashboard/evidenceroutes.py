"""The dashboard's evidence routes: the control plane's own bundle, the bundles the router
uploaded (trueup/server/service/evidence.py), and the operators' request for a fresh one.

`register` is called by routes.register with its session helpers (`caller`, `posted`,
`guarded`, `device_page`), so these routes check the session, the role and the CSRF
token exactly as the other dashboard routes do.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server.api.routes.evidence import evidence_response
from trueup.server.dashboard import data
from trueup.server.dashboard.devicedata import evidence_parts
from trueup.server.dashboard.evidence import build_bundle
from trueup.server.inputs import IDENTIFIER
from trueup.server.service import ControlPlane
from trueup.server.service.evidence import EvidenceSummary

__all__ = ["register"]


def register(
    app: FastAPI,
    plane: ControlPlane,
    *,
    caller: Callable[..., Any],
    posted: Callable[..., Any],
    guarded: Callable[[Request, str, Any], Awaitable[Response]],
    device_page: Callable[..., Any],
    session_role: JSONObject,
    headers: dict[str, str],
) -> None:
    @app.get("/ui/devices/{device}/evidence", include_in_schema=False, openapi_extra=session_role)
    async def evidence(request: Request, device: str) -> Response:
        async def work() -> Response:
            principal, _session = await caller(request)

            def build() -> bytes:
                page = device_page(principal, "", device)
                return build_bundle(device, evidence_parts(page), page.now)

            content = await run_in_threadpool(build)
            name = f"{device}-evidence-{data.iso(time.time()).replace(':', '')}.tar.gz"
            return Response(
                content,
                media_type="application/gzip",
                headers={**headers, "Content-Disposition": f'attachment; filename="{name}"'},
            )

        return await guarded(request, "viewer", work)

    @app.post(
        "/ui/devices/{device}/evidence-requests",
        include_in_schema=False,
        openapi_extra=session_role,
    )
    async def request_evidence(request: Request, device: str) -> Response:
        async def work() -> Response:
            principal, _session, _form = await posted(request, "operator")
            await run_in_threadpool(
                plane.request_evidence, principal.tenant_id, device, principal.actor
            )
            return RedirectResponse(
                f"/ui/devices/{quote(device)}#evidence", status_code=303, headers=headers
            )

        return await guarded(request, "operator", work)

    @app.get(
        "/ui/devices/{device}/evidence/{evidence_id}",
        include_in_schema=False,
        openapi_extra=session_role,
    )
    async def download_evidence(request: Request, device: str, evidence_id: str) -> Response:
        async def work() -> Response:
            principal, _session = await caller(request)
            # Parsed here, not by FastAPI: a refusal is the dashboard's page, naming the field.
            bundle_id = IDENTIFIER.parse("evidence id", evidence_id)

            def find() -> EvidenceSummary:
                found = plane.evidence_bundle(principal.tenant_id, device, bundle_id)
                plane.audit_evidence_download(
                    principal.tenant_id, device, bundle_id, principal.actor
                )
                return found

            found = await run_in_threadpool(find)
            response = evidence_response(plane, device, found)
            response.headers.update(headers)
            return response

        return await guarded(request, "viewer", work)
