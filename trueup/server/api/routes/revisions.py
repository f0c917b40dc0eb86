"""Desired revisions: read the desired one, put the next one (If-Match), the history.

`PUT …/desired` takes JSON or YAML (at most `DOCUMENT_BYTES`, nested at most
`MAX_DEPTH` levels, YAML without aliases: trueup.model.decode). Without
If-Match it is 428; a stale If-Match is 409 with STATE_CONCURRENT_MODIFICATION
(app.py maps Conflict). `X-Trueup-Comment` is UTF-8. `X-Trueup-Confirm-Within:
SECONDS` stores the revision with a confirmation window: the agent applies it
with `--confirm-within` semantics, confirms it itself once its health holds,
and rolls it back by itself when the window passes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_json, decode_yaml
from trueup.server.api.context import Api, role
from trueup.server.api.records import RevisionsAnswer, ServiceRecord
from trueup.server.api.responses import DEVICE, answers
from trueup.server.inputs import COMMENT_HEADER, IF_MATCH, RevisionPath, Rule, check_text
from trueup.server.limits import DOCUMENT_BYTES, MAX_DEPTH, TEXT_LENGTH, excerpt
from trueup.server.service import Invalid, Principal

__all__ = ["parse_comment", "parse_confirm_within", "parse_if_match", "register"]

MAX_CONFIRM_WITHIN = 86400
CONFIRM_WITHIN_HEADER = Rule(
    f"a confirmation window in seconds: an integer from 1 to {MAX_CONFIRM_WITHIN}",
    str,
    {"pattern": r"^[0-9]{1,5}$", "max_length": 5},
)


def parse_confirm_within(value: str | None) -> int | None:
    """`X-Trueup-Confirm-Within` as seconds (1 to a day); None when absent."""
    if value is None:
        return None
    text = value.strip()
    # At most 5 digits (the header's rule) before int(): thousands of them are refused, not
    # handed to int() (which refuses over 4300 digits with a ValueError, a server error).
    digits = len(text) <= len(str(MAX_CONFIRM_WITHIN)) and text.isascii() and text.isdigit()
    if not digits or not 1 <= int(text) <= MAX_CONFIRM_WITHIN:
        raise Invalid(
            [
                f"header.X-Trueup-Confirm-Within: {excerpt(repr(value), 40)} is not "
                f"{CONFIRM_WITHIN_HEADER.expected}"
            ]
        )
    return int(text)


def parse_if_match(value: str | None) -> int:
    """The version an If-Match header names (`3`, `"3"` or `W/"3"`), 0 to MAX_VERSION - 1."""
    if value is None:
        raise HTTPException(
            428,
            detail="If-Match is required: send the version you expect to replace "
            "(0 for a device without revisions)",
        )
    if IF_MATCH.problems("If-Match", value):
        raise Invalid([f"header.If-Match: {excerpt(repr(value), 40)} is not {IF_MATCH.expected}"])
    # The pattern (trueup.server.inputs) bounds the number: at most MAX_VERSION - 1.
    digits = value.strip().removeprefix("W/").strip('"').lstrip("0")
    return int(digits or "0")


def parse_comment(value: str) -> str:
    """`X-Trueup-Comment` as UTF-8 text (HTTP carries header bytes; Starlette gives latin-1)."""
    try:
        text = value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise Invalid(["header.X-Trueup-Comment: not UTF-8 text"]) from None
    if len(value) > TEXT_LENGTH:
        raise Invalid([f"header.X-Trueup-Comment: longer than {TEXT_LENGTH} bytes"])
    try:
        return check_text(text)
    except ValueError as exc:
        raise Invalid([f"header.X-Trueup-Comment: {exc}"]) from None


def parse_body(raw: bytes, content_type: str) -> Any:
    """The document in a request body, decoded within the limits (trueup.model.decode)."""
    try:
        if "yaml" in content_type:
            return decode_yaml(raw, max_bytes=DOCUMENT_BYTES, max_depth=MAX_DEPTH)
        return decode_json(raw, max_bytes=DOCUMENT_BYTES, max_depth=MAX_DEPTH)
    except DecodeError as exc:
        raise Invalid([f"(document): {exc}"]) from None


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.get(
        "/api/v1/devices/{device}/desired", openapi_extra=role("viewer"), responses=answers(404)
    )
    def get_desired(device: DEVICE, response: Response, p: Principal = viewer) -> ServiceRecord:
        revision = plane.desired(p.tenant_id, device)
        if revision is None:
            response.headers["ETag"] = '"0"'
            return {"device": device, "version": 0, "document": None}
        response.headers["ETag"] = f'"{revision.version}"'
        return {**revision.summary(), "document": revision.document}

    @app.put(
        "/api/v1/devices/{device}/desired",
        status_code=201,
        responses=answers(404, 409, 413, 428),
        openapi_extra={
            **role("operator", max_body=DOCUMENT_BYTES),
            # Read by the route itself (parse_if_match, parse_comment), declared here.
            "parameters": [
                IF_MATCH.header("If-Match"),
                COMMENT_HEADER.header("X-Trueup-Comment"),
                CONFIRM_WITHIN_HEADER.header("X-Trueup-Confirm-Within"),
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/yaml": {"schema": {"type": "object"}},
                },
            },
        },
    )
    async def put_desired(
        device: DEVICE,
        request: Request,
        response: Response,
        p: Principal = operator,
    ) -> ServiceRecord:
        expected = parse_if_match(request.headers.get("if-match"))
        comment = parse_comment(request.headers.get("x-trueup-comment", ""))
        confirm_within = parse_confirm_within(request.headers.get("x-trueup-confirm-within"))
        data = parse_body(await request.body(), request.headers.get("content-type", ""))
        revision = await run_in_threadpool(
            lambda: plane.put_desired(
                p.tenant_id,
                device,
                expected,
                data,
                author=p.actor,
                comment=comment,
                confirm_within=confirm_within,
            )
        )
        api.metrics.revisions.inc()
        device_id = await run_in_threadpool(plane.device_id, p.tenant_id, device)
        api.watcher.wake(device_id)
        response.headers["ETag"] = f'"{revision.version}"'
        return dict(revision.summary())

    @app.get(
        "/api/v1/devices/{device}/revisions", openapi_extra=role("viewer"), responses=answers(404)
    )
    def list_revisions(device: DEVICE, p: Principal = viewer) -> RevisionsAnswer:
        return {"revisions": [dict(r.summary()) for r in plane.revisions(p.tenant_id, device)]}

    @app.get(
        "/api/v1/devices/{device}/revisions/{version}",
        openapi_extra=role("viewer"),
        responses=answers(404),
    )
    def get_revision(
        device: DEVICE,
        version: RevisionPath,
        p: Principal = viewer,
    ) -> ServiceRecord:
        revision = plane.revision(p.tenant_id, device, version)
        return {**revision.summary(), "document": revision.document}
