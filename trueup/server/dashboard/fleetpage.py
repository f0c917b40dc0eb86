"""The dashboard's fleet page (`/`) and its live stream: the fleet table, filtered by the
URL (status, reason code, search, label selector, page), sent again whenever it changes.
Viewers read it; tenants see only their own devices (data.fleet_page)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from fastapi import HTTPException
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams

from trueup.model.layering import SelectorError, parse_selector
from trueup.server.dashboard import data
from trueup.server.dashboard.html import fleet_body, fleet_page
from trueup.server.dashboard.pages import PageCall, Pages
from trueup.server.inputs import PAGE, SEARCH, InputError
from trueup.server.limits import SELECTOR_LENGTH

__all__ = ["STREAM_SECONDS", "FleetFilters", "filters_of", "register"]

STREAM_SECONDS = 2.0  # how often the live fleet stream looks for changes


@dataclass(frozen=True)
class FleetFilters:
    """What the URL asks the fleet table to show (unknown values already dropped)."""

    status: str = ""
    reason: str = ""
    search: str = ""
    selector: str = ""
    page: int = 1


def filters_of(q: QueryParams) -> tuple[FleetFilters, list[str]]:
    """The fleet's filters from the URL, and a problem for each unknown value (an
    unknown status or reason code is never quietly dropped: it would show a fleet
    that does not match what the URL asks for)."""
    status = q.get("status", "")
    reason = q.get("reason", "")
    problems = data.filter_problems(status=status, reason=reason)
    search, page = "", 1
    try:
        search = SEARCH.parse("q", q.get("q", ""))
    except InputError as exc:
        problems.append(str(exc))
    selector = q.get("selector", "")
    if len(selector) > SELECTOR_LENGTH:
        problems.append(f"selector: longer than {SELECTOR_LENGTH} characters")
        selector = ""
    try:
        parse_selector(selector)
    except SelectorError as exc:
        problems.append(f"selector: {exc}")
        selector = ""
    try:
        page = PAGE.parse("page", q.get("page", "1"))
    except InputError as exc:
        problems.append(str(exc))
    chosen = FleetFilters(
        status=status if status in data.STATUSES else "",
        reason=reason if reason in data.REASONS else "",
        search=search,
        selector=selector,
        page=page,
    )
    return chosen, problems


def register(pages: Pages) -> None:
    plane = pages.plane

    def table(call: PageCall, f: FleetFilters) -> data.FleetPage:
        return data.fleet_page(plane, call.tenant_id, **asdict(f))

    @pages.get("/")
    async def fleet(call: PageCall) -> Response:
        f, problems = filters_of(call.request.query_params)
        page = await run_in_threadpool(table, call, f)
        body = fleet_page(
            page,
            status=f.status,
            reason=f.reason,
            search=f.search,
            selector=f.selector,
            problems=problems,
        )
        return call.page("Fleet", body, 422 if problems else 200)

    @pages.get("/ui/fleet/stream")
    async def fleet_stream(call: PageCall) -> Response:
        f, problems = filters_of(call.request.query_params)
        if problems:
            raise HTTPException(422, detail="; ".join(problems))

        async def look() -> str:
            page = await run_in_threadpool(table, call, f)
            parts = {
                "rows": fleet_body(page),
                "counts": page.counts,
                "total": page.total,
                "matched": page.matched,
            }
            return json.dumps(parts)

        return pages.live(call, "fleet", STREAM_SECONDS, look)
