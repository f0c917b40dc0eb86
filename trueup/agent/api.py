"""The agent API: the same routes on the unix socket and on the management port.

Nothing here is gated by service health (promise 1): status, drift, apply,
rollback, reconcile, evidence, limitations and restore (`/v1/restore`, `/v1/restore/analyze`,
`/v1/restore/apply`) are always served. The management
port requires a bearer token (stored hashed in the state directory); the unix
socket is protected by its file mode (0600, root).
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING, Any

from fastapi import Body, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from trueup.agent.restoring import restore_analyze, restore_apply, restore_status
from trueup.backup.reader import ProblemJSON
from trueup.backup.restore import RestoreRefused
from trueup.journal.atomic import StateFileError
from trueup.journal.limitations import (
    LimitationError,
    add_limitation,
    list_limitations,
    withdraw_limitation,
)
from trueup.journal.lock import LockBusy
from trueup.journal.restore import read_record
from trueup.model.digests import token_hash
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import ReasonCode
from trueup.reconcile.answers import WriteAnswer
from trueup.reconcile.changes import Refused, StorageError, UnknownRevision

if TYPE_CHECKING:
    from trueup.agent.process import Agent

__all__ = ["create_app", "hash_token"]

log = logging.getLogger("trueup.agent")

_PUBLIC = {"/v1/health/management", "/v1/health/services"}


def hash_token(token: str) -> str:
    """How the agent stores a management-port token: the one token hash, labelled."""
    return "sha256:" + token_hash(token)


def _refusal(exc: Refused) -> JSONResponse:
    return JSONResponse(
        status_code=409,
        content={"code": exc.code.value, "message": str(exc), "evidence": exc.evidence},
    )


def _result_status(result: WriteAnswer) -> int:
    """200 applied; 428 refused until --confirm-within is given; 500 failed and rolled back."""
    if result.get("ok"):
        return 200
    return 428 if result.get("outcome") == "refused" else 500


def _parse(document: JSONObject) -> DeviceState | JSONResponse:
    try:
        return parse_document(document, "request body")
    except DocumentError as exc:
        return JSONResponse(
            status_code=422,
            content={
                "message": "invalid document",
                "problems": exc.problems,
                "code": ReasonCode.VERSION_SKEW.value if exc.unsupported_version else None,
            },
        )


def _if_match(value: str | None) -> int | None:
    if value is None or value.strip() in ("", "*"):
        return None
    text = value.strip().strip('"').removeprefix("W/").strip('"')
    try:
        return int(text)
    except ValueError:
        raise HTTPException(
            400, f"If-Match: expected an applied version number, got {value!r}"
        ) from None


def create_app(agent: Agent, *, require_token: bool) -> FastAPI:
    """The agent's API; `require_token` on the management port (the unix socket has none)."""
    app = FastAPI(title="trueup agent", version="1")
    _errors(app)
    if require_token:
        _bearer(app, agent)
    _health_routes(app, agent)
    _write_routes(app, agent)
    _loop_routes(app, agent)
    _limitation_routes(app, agent)
    _restore_routes(app, agent)
    return app


def _errors(app: FastAPI) -> None:
    """A refused write to the state directory is a 507; a damaged state file a 500."""

    @app.exception_handler(StorageError)
    async def storage_error(request: Request, exc: StorageError) -> JSONResponse:
        del request
        return JSONResponse(status_code=507, content={"ok": False, "message": str(exc)})

    @app.exception_handler(StateFileError)
    async def state_file_error(request: Request, exc: StateFileError) -> JSONResponse:
        del request
        return JSONResponse(status_code=500, content={"ok": False, "message": str(exc)})


def _bearer(app: FastAPI, agent: Agent) -> None:
    """Every route but the two health probes asks for a bearer token."""

    @app.middleware("http")
    async def bearer(request: Request, call_next: Any) -> Response:
        if request.url.path not in _PUBLIC:
            header = request.headers.get("authorization", "")
            token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
            if not token or not agent.token_valid(token):
                return JSONResponse(
                    status_code=401,
                    content={"message": "bearer token required (trueup agent token create)"},
                    headers={"WWW-Authenticate": "Bearer"},
                )
        response: Response = await call_next(request)
        return response


def _health_routes(app: FastAPI, agent: Agent) -> None:
    """What the agent reports: health, status, drift, evidence, metrics."""

    @app.get("/v1/health/management")
    def health_management() -> JSONResponse:
        body = agent.management_health()
        return JSONResponse(status_code=200 if body["ready"] else 503, content=body)

    @app.get("/v1/health/services")
    def health_services() -> JSONResponse:
        return JSONResponse(content=agent.services_health())

    @app.get("/v1/status")
    def status() -> JSONResponse:
        return JSONResponse(content=agent.status().to_json())

    @app.get("/v1/drift")
    def drift() -> JSONResponse:
        return JSONResponse(content=agent.drift())

    @app.get("/v1/evidence")
    def evidence() -> Response:
        return Response(
            content=agent.evidence(),
            media_type="application/gzip",
            headers={"Content-Disposition": 'attachment; filename="trueup-evidence.tar.gz"'},
        )

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(agent.metrics(), media_type="text/plain; version=0.0.4")


def _write_routes(app: FastAPI, agent: Agent) -> None:
    """The operator's writes and their plan (`trueup.reconcile.requests`)."""

    @app.post("/v1/apply")
    def apply(
        document: JSONObject = Body(...),
        if_match: str | None = Header(None),
        mode: str = "atomic",
        confirm_within: float | None = None,
        actor: str = "api",
        override: str | None = None,
    ) -> JSONResponse:
        if mode not in ("atomic", "best-effort"):
            raise HTTPException(422, "mode: expected atomic or best-effort")
        parsed = _parse(document)
        if isinstance(parsed, JSONResponse):
            return parsed
        try:
            result = agent.requests.apply(
                parsed,
                mode=mode,
                expect_version=_if_match(if_match),
                actor=actor,
                confirm_within=confirm_within,
                override=override,
            )
        except Refused as exc:
            return _refusal(exc)
        return JSONResponse(status_code=_result_status(result), content=result)

    @app.post("/v1/plan")
    def plan(document: JSONObject = Body(...)) -> JSONResponse:
        parsed = _parse(document)
        if isinstance(parsed, JSONResponse):
            return parsed
        return JSONResponse(content=agent.requests.plan(parsed).to_json())

    @app.post("/v1/rollback")
    def rollback(
        to: int | None = None,
        if_match: str | None = Header(None),
        confirm_within: float | None = None,
        actor: str = "api",
        override: str | None = None,
    ) -> JSONResponse:
        try:
            result = agent.requests.rollback(
                to,
                expect_version=_if_match(if_match),
                actor=actor,
                confirm_within=confirm_within,
                override=override,
            )
        except Refused as exc:
            return _refusal(exc)
        except UnknownRevision as exc:
            raise HTTPException(404, str(exc)) from None
        return JSONResponse(status_code=_result_status(result), content=result)


def _loop_routes(app: FastAPI, agent: Agent) -> None:
    """What the reconcile loop answers once it runs: confirm, reconcile, ack."""

    @app.post("/v1/confirm")
    def confirm() -> JSONResponse:
        try:
            return JSONResponse(content=agent.requests.confirm())
        except Refused as exc:
            return _refusal(exc)

    @app.post("/v1/reconcile")
    def reconcile(subsystem: str | None = None) -> JSONResponse:
        try:
            result = agent.requests.reconcile(subsystem)
        except Refused as exc:
            return _refusal(exc)
        except KeyError as exc:
            raise HTTPException(404, f"unknown subsystem {exc.args[0]!r}") from None
        return JSONResponse(status_code=200 if result["ok"] else 500, content=result)

    @app.post("/v1/ack")
    def ack(subsystem: str, seconds: float, reason: str, actor: str = "api") -> JSONResponse:
        try:
            answer = agent.requests.acknowledge(subsystem, seconds, reason, actor=actor)
        except KeyError as exc:
            raise HTTPException(404, f"unknown subsystem {exc.args[0]!r}") from None
        return JSONResponse(content=answer)

    @app.delete("/v1/ack")
    def clear_ack(subsystem: str, actor: str = "api") -> JSONResponse:
        """Withdraw an acknowledgement before it expires (audited `ack_cleared`)."""
        try:
            return JSONResponse(
                content=agent.requests.clear_acknowledgement(subsystem, actor=actor)
            )
        except KeyError as exc:
            raise HTTPException(404, f"unknown subsystem {exc.args[0]!r}") from None


def _limitation_routes(app: FastAPI, agent: Agent) -> None:
    """Known limitations: permanent, reviewed accepted differences."""

    @app.get("/v1/limitations")
    def limitations(all: bool = False) -> JSONResponse:
        records = list_limitations(agent.state.root, include_withdrawn=all)
        return JSONResponse(content={"limitations": [record.to_json() for record in records]})

    @app.post("/v1/limitations")
    def limitation_add(body: JSONObject = Body(...)) -> JSONResponse:
        try:
            record = add_limitation(
                agent.state.root,
                str(body.get("subsystem") or ""),
                str(body.get("path") or ""),
                reason=str(body.get("reason") or ""),
                reviewed_by=str(body.get("reviewed_by") or ""),
                ticket=body.get("ticket"),
                actor=str(body.get("actor") or "api"),
                known_subsystems=list(agent.engine.by_name),
            )
        except LimitationError as exc:
            raise HTTPException(422, str(exc)) from None
        return JSONResponse(status_code=201, content=record.to_json())

    @app.post("/v1/limitations/{limitation_id}/withdraw")
    def limitation_withdraw(limitation_id: str, body: JSONObject = Body(...)) -> JSONResponse:
        try:
            record = withdraw_limitation(
                agent.state.root,
                limitation_id,
                reason=str(body.get("reason") or ""),
                actor=str(body.get("actor") or "api"),
            )
        except LimitationError as exc:
            raise HTTPException(422, str(exc)) from None
        except KeyError:
            raise HTTPException(404, f"unknown limitation {limitation_id!r}") from None
        return JSONResponse(content=record.to_json())


def _restore_routes(app: FastAPI, agent: Agent) -> None:
    """The restore state machine (`trueup.agent.restoring`): status, analyze, apply."""

    @app.get("/v1/restore")
    def restore() -> JSONResponse:
        return JSONResponse(content=restore_status(agent))

    @app.post("/v1/restore/analyze")
    def restore_analyze_route(body: JSONObject = Body(...)) -> JSONResponse:
        archive, mappings = body.get("archive"), body.get("mappings") or {}
        if not isinstance(archive, str) or not isinstance(mappings, dict):
            raise HTTPException(422, "body: {archive: PATH, mappings: {OLD: NEW}}")
        try:
            return JSONResponse(content=restore_analyze(agent, archive, mappings))
        except Exception as exc:  # the analysis names problems; anything else is a 409 too
            log.exception("restore analyze of %s failed", archive)
            return JSONResponse(
                status_code=409,
                content={"message": f"{archive}: cannot be analysed: {exc}", "problems": []},
            )

    @app.post("/v1/restore/apply")
    def restore_apply_route(body: JSONObject = Body(...)) -> JSONResponse:
        archive, mode = body.get("archive"), body.get("mode")
        mappings = body.get("mappings") or {}
        if not isinstance(archive, str) or mode not in ("config-only", "full"):
            raise HTTPException(
                422, "body: {archive: PATH, mode: config-only|full, mappings, reboot}"
            )
        try:
            record = restore_apply(
                agent,
                archive,
                str(mode),
                dict(mappings),
                reboot=bool(body.get("reboot")),
                actor=str(body.get("actor") or "api"),
            )
        except RestoreRefused as exc:
            return _restore_refusal(agent, str(exc), exc.problems)
        except Refused as exc:
            return _restore_refusal(agent, str(exc), [])
        except LockBusy as exc:
            return _restore_refusal(agent, f"{exc}; the agent retries by itself", [])
        except Exception as exc:  # never a 500: a refusal with its next step
            log.exception("restore apply of %s failed", archive)
            return _restore_refusal(
                agent, f"the restore could not go on: {type(exc).__name__}: {exc}", []
            )
        return JSONResponse(content=record)


def _restore_refusal(agent: Agent, message: str, problems: list[ProblemJSON]) -> JSONResponse:
    """409: what refused, the record (when one is pending) and the next step."""
    pending = read_record(agent.state.root)
    content: dict[str, Any] = {"message": message, "problems": problems}
    if pending is not None and pending.get("state") not in ("completed", "rolled_back"):
        content["restore"] = pending
        content["next"] = pending.get("next")
    else:
        content["next"] = (
            "nothing was changed: `trueup restore analyze ARCHIVE` names every problem"
        )
    return JSONResponse(status_code=409, content=content)


def token_matches(stored: list[str], token: str) -> bool:
    candidate = hash_token(token)
    return any(hmac.compare_digest(candidate, s) for s in stored)
