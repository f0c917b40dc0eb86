"""The dashboard's routes, one registrar per page; `register(app, api)` adds them all.

pages.py          how a page route is declared (session, role, CSRF, rendering, errors)
loginroutes.py    sign-in and sign-out (same-origin checks, the session cookie)
fleetpage.py      the fleet table and its live stream
devicepage.py     a device: the page, its stream, apply and acknowledge
evidenceroutes.py a device's evidence bundles
fleetroutes.py    profiles and the plan
rolloutroutes.py  rollouts: the list, one rollout and its stream, start and act
here              the static files (CSS, JavaScript)

Routes are hidden from OpenAPI and declare the role `session` (the edge
middleware lets them through; each one checks the session cookie itself and
then the same role the matching JSON route needs: viewer to read, operator to
apply or acknowledge, admin for the audit trail). Tenants see only their own
devices: every read goes through the service layer with the caller's tenant.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response

from trueup.server.api.context import Api, role
from trueup.server.dashboard import (
    devicepage,
    evidenceroutes,
    fleetpage,
    fleetroutes,
    loginroutes,
    rolloutroutes,
)
from trueup.server.dashboard.device import DevicePage
from trueup.server.dashboard.devicedata import load_device_page
from trueup.server.dashboard.pages import FORM_BYTES, HEADERS, Pages
from trueup.server.service import Principal

__all__ = ["register"]

_STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}


def register(app: FastAPI, api: Api) -> None:
    pages = Pages(app, api)
    app.state.dashboard_pages = pages  # what was declared how (the tests read it)
    loginroutes.register(pages)
    _register_static(app)
    fleetpage.register(pages)
    devicepage.register(pages, api)

    def device_page(principal: Principal, csrf: str, device: str, **extra: object) -> DevicePage:
        return load_device_page(api.plane, principal, csrf, device, **extra)

    evidenceroutes.register(
        app,
        api.plane,
        caller=pages.caller,
        posted=pages.posted,
        guarded=pages.guarded,
        device_page=device_page,
        session_role=role("session", FORM_BYTES),
        headers=HEADERS,
    )
    fleetroutes.register(pages)
    rolloutroutes.register(pages)


def _register_static(app: FastAPI) -> None:
    @app.get("/ui/static/{name}", include_in_schema=False, openapi_extra=role("public", FORM_BYTES))
    async def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404, detail="no such file")
        content = resources.files("trueup.server.dashboard").joinpath("static", name).read_bytes()
        return Response(content, media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"})
