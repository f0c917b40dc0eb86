"""The dashboard's device page (`/ui/devices/{device}`): the page with a revision diff on
request, its live stream, and its two forms: apply a document (with the If-Match version
the page was shown at) and acknowledge a subsystem's drift.

Viewers read; operators apply and acknowledge. Each change is the service call the JSON
API makes (audited there); a refusal shows the page again with the error and the draft.
"""

from __future__ import annotations

import json
from functools import partial
from urllib.parse import quote, urlencode

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.server.api.context import Api
from trueup.server.dashboard.device import DevicePage, live_parts, render_device, revision_diff
from trueup.server.dashboard.devicedata import load_device_page
from trueup.server.dashboard.pages import APPLY_BYTES, PageCall, Pages
from trueup.server.inputs import (
    ACK_REASON,
    ACK_SECONDS,
    COMMENT,
    EXPECTED_VERSION,
    REVISION,
    SUBSYSTEM,
    InputError,
)
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import Busy, Conflict, ControlPlane, Invalid, NotFound

__all__ = ["DEVICE_STREAM_SECONDS", "register"]

DEVICE_STREAM_SECONDS = 1.0  # how often a device page's stream looks for changes


def _notice(call: PageCall) -> str:
    if call.query("applied"):
        applied = REVISION.parse("applied", call.query("applied"))
        return f"revision {applied} stored; the agent applies it next"
    if call.query("acked"):
        return "acknowledgement recorded"
    return ""


def _compared(call: PageCall) -> tuple[int, int] | None:
    """The revisions to compare: both or neither (the form sends both)."""
    q = call.request.query_params
    if q.get("a") is None and q.get("b") is None:
        return None
    return REVISION.parse("a", q.get("a", "")), REVISION.parse("b", q.get("b", ""))


def _acknowledgement(form: dict[str, str]) -> tuple[str, int, str]:
    """The acknowledge form's subsystem, seconds and reason; Invalid naming each problem."""
    fields = [
        (rule, name, form.get(name, ""))
        for rule, name in (
            (SUBSYSTEM, "subsystem"),
            (ACK_SECONDS, "for_seconds"),
            (ACK_REASON, "reason"),
        )
    ]
    problems = [p for rule, name, raw in fields for p in rule.problems(name, raw)]
    if problems:
        raise Invalid(problems)
    subsystem, seconds, reason = (rule.parse(n, raw) for rule, n, raw in fields)
    return subsystem, seconds, reason


def _page(plane: ControlPlane, call: PageCall, **extra: object) -> DevicePage:
    return load_device_page(plane, call.principal, call.csrf, call.path("device"), **extra)


def _store(api: Api, call: PageCall, text: str) -> tuple[int, DevicePage | None]:
    """Store the posted document as the device's next desired revision: (its version,
    None), or (status, the page again with the refusal and the draft)."""
    plane, device, form = api.plane, call.path("device"), call.form
    extra: dict[str, object] = {"draft": text}
    try:
        try:
            expected = EXPECTED_VERSION.parse("expected", form.get("expected", ""))
            comment = COMMENT.parse("comment", form.get("comment", ""))
        except InputError as exc:
            raise Invalid([str(exc)]) from None
        extra["expected"] = expected
        try:
            document = decode_yaml(text, max_bytes=DOCUMENT_BYTES)
        except DecodeError as exc:
            raise Invalid([f"(document): {exc}"]) from None
        revision = plane.put_desired(
            call.tenant_id,
            device,
            expected,
            document,
            author=call.principal.actor,
            comment=comment,
        )
    except Conflict as exc:
        api.metrics.conflicts.inc()
        return 409, _page(plane, call, conflict=exc.body(), **extra)
    except Invalid as exc:
        error = "invalid, nothing was changed: " + "; ".join(exc.problems[:10])
        return 422, _page(plane, call, error=error, **extra)
    except Busy as exc:  # a rollout holds the device: refused, naming it
        api.metrics.conflicts.inc()
        return 409, _page(plane, call, error=str(exc), **extra)
    api.metrics.revisions.inc()
    api.watcher.wake(plane.device_id(call.tenant_id, device))
    return revision.version, None


def register(pages: Pages, api: Api) -> None:
    plane = pages.plane

    device_page = partial(_page, plane)

    @pages.get("/ui/devices/{device}")
    async def device_view(call: PageCall) -> Response:
        device, notice, compare = call.path("device"), _notice(call), _compared(call)

        def build() -> DevicePage:
            page = device_page(call, notice=notice)
            if compare is not None:
                ra = plane.revision(call.tenant_id, device, compare[0])
                rb = plane.revision(call.tenant_id, device, compare[1])
                page.diff = (
                    ra.version,
                    rb.version,
                    revision_diff(ra.document, rb.document, ra.version, rb.version),
                )
            return page

        page = await run_in_threadpool(build)
        return call.page(device, render_device(page))

    @pages.get("/ui/devices/{device}/stream")
    async def device_stream(call: PageCall) -> Response:
        """The device page's live parts (`live_parts`), sent when they change."""
        # Not found outside the caller's tenant: answered before the stream starts.
        await run_in_threadpool(plane.fleet, call.tenant_id, call.path("device"))

        async def look() -> str | None:
            try:
                page = await run_in_threadpool(device_page, call)
            except NotFound:
                return None
            return json.dumps(live_parts(page))

        return pages.live(call, "device", DEVICE_STREAM_SECONDS, look)

    @pages.post("/ui/devices/{device}/apply", max_body=APPLY_BYTES)
    async def apply(call: PageCall) -> Response:
        device, text = call.path("device"), call.form.get("document", "")

        status, page = await run_in_threadpool(_store, api, call, text)
        if page is None:
            query = urlencode({"applied": status})
            return call.redirect(f"/ui/devices/{quote(device)}?{query}")
        return call.page(device, render_device(page), status)

    @pages.post("/ui/devices/{device}/ack")
    async def acknowledge(call: PageCall) -> Response:
        device = call.path("device")

        def attempt() -> DevicePage | None:
            try:
                subsystem, seconds, reason = _acknowledgement(call.form)
                plane.acknowledge(
                    call.tenant_id, device, subsystem, seconds, reason, call.principal.actor
                )
            except Invalid as exc:
                return device_page(call, error="not acknowledged: " + "; ".join(exc.problems))
            return None

        page = await run_in_threadpool(attempt)
        if page is None:
            return call.redirect(f"/ui/devices/{quote(device)}?acked=1#acks")
        return call.page(device, render_device(page), 422)
