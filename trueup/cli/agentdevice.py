"""The router as a running agent answers for it: each CLI verb as one request on its socket.

`AgentDevice` is the agent half of `trueup.cli.device.Device` (the local half
is `trueup.cli.device.LocalDevice`): the verb's request, the route's refusals
printed the way the CLI prints them (`Failed`), and the answer's body. Standard
library only, like the client it wraps (`trueup.agent.client`): the fast path
(`trueup.cli.fast`) sends its writes through this class too, so a request is
built in one place whichever CLI path runs it.

A read the agent stops answering is read again from the state directory
(`fallback`, the local device); a write is sent once: `AgentUnavailable`
reaches the console entry, which prints what to run next.
"""

from __future__ import annotations

import os

from trueup.agent.client import (
    HEALTH_TIMEOUT,
    REQUEST_TIMEOUT,
    AgentClient,
    AgentUnavailable,
    Response,
)
from trueup.cli.output import REFUSAL_EXIT_CODES, echo

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from trueup.cli.bodies import (
        AgentRecord,
        ApplyBody,
        LimitationRecord,
        MessageBody,
        PlanBody,
        RestoreRefusal,
        StatusBody,
    )
    from trueup.cli.device import LocalDevice
    from trueup.journal.restore import RestoreRecord
    from trueup.model.document import DeviceState

__all__ = ["AgentDevice", "Failed", "actor", "agent_client", "fail", "refused", "restore_failed"]

EVIDENCE_TIMEOUT = 30.0  # the agent collects its bundle in a few seconds; a hung one gets this
STATUS_TIMEOUT = 15.0  # `trueup doctor`'s patience with a slow status
RESTORE_TIMEOUT = 900.0  # a full restore stops Kea, swaps the leases, applies and verifies


class Failed(SystemExit):
    """A verb the device refused or could not do, already explained on stderr: exit `code`.

    A `SystemExit`, so the typer commands, the fast path and typer's test runner
    all end with this code without a traceback, however deep it was raised.
    """

    def __init__(self, code: int = 1) -> None:
        super().__init__(code)
        self.exit_code = code


def fail(message: str, code: int = 1) -> Failed:
    """`trueup: MESSAGE` on stderr; the exception to raise (exit `code`)."""
    echo(f"trueup: {message}", err=True)
    return Failed(code)


def refused(code: str, message: str) -> Failed:
    """`CODE: message` on stderr; the exception to raise (exit with the refusal code's exit
    code: `trueup.model.reasons.EXIT_CODES`)."""
    echo(f"{code}: {message}", err=True)
    return Failed(REFUSAL_EXIT_CODES.get(code, 1))


def restore_failed(why: object) -> Failed:
    """`trueup restore apply: WHY` on stderr; the exception to raise (exit 1)."""
    echo(f"trueup restore apply: {why}", err=True)
    return Failed(1)


def actor() -> str:
    """Who the CLI writes as (audited): `cli:UID`."""
    return f"cli:{os.getuid()}"


def agent_client(
    state_dir: str | os.PathLike[str], *, write: bool, read_timeout: float = HEALTH_TIMEOUT
) -> AgentClient | None:
    """The client of the agent on `state_dir`'s socket; None when no agent is there.

    A write is sent once: it asks first whether the agent answers its health
    check. A read is safe to repeat: it goes straight to its route, with the
    health check's timeout (`read_timeout`: one round trip), and whoever sent it reads the
    state directory itself when it is not answered. The typer commands
    (`trueup.cli.device.device_for`) and the fast path (`trueup.cli.fast`)
    both connect here.
    """
    if write:
        return AgentClient.connect(state_dir)
    return AgentClient.at(state_dir, timeout=read_timeout)


def _object(response: Response) -> Any:
    """The answer's JSON object, copied (ValueError when it is not JSON)."""
    return dict(response.json())


def _detail(response: Response, default: str) -> str:
    try:
        detail = response.json().get("detail", default)
    except (ValueError, AttributeError):
        detail = default
    return str(detail)


class AgentDevice:
    """The verbs over a running agent's API (`docs/agent-api.md`)."""

    def __init__(self, client: AgentClient, fallback: LocalDevice | None = None) -> None:
        self.client = client
        self.fallback = fallback

    @classmethod
    def on(cls, state_dir: str | os.PathLike[str], *, write: bool = True) -> AgentDevice | None:
        """The agent on `state_dir` (`agent_client`), else None."""
        client = agent_client(state_dir, write=write)
        return None if client is None else cls(client)

    def _body(self, response: Response) -> Any:
        """The route's JSON object (the caller names its shape); `Failed`, after printing
        why, when the agent refused or failed it."""
        try:
            body = response.json()
        except ValueError:
            raise fail(f"agent answered {response.status_code}: {response.text[:200]}") from None
        if response.status_code == 409:
            raise refused(body["code"], body["message"])
        if response.status_code == 422:
            echo("request body: invalid document", err=True)
            for problem in body.get("problems", []):
                echo(f"  {problem}", err=True)
            raise Failed(1)
        if response.status_code == 507 or (response.status_code >= 400 and "ok" not in body):
            raise fail(str(body.get("message") or f"agent answered {response.status_code}: {body}"))
        return dict(body)

    def _local(self) -> LocalDevice:
        if self.fallback is None:
            from trueup.cli.device import LocalDevice

            self.fallback = LocalDevice(os.path.dirname(self.client.socket_path))
        return self.fallback

    # -- reads -------------------------------------------------------------------
    def status(self) -> StatusBody:
        try:
            body: StatusBody = _object(self.client.request("GET", "/v1/status"))
        except AgentUnavailable:
            return self._local().status()
        return body

    def doctor_status(self) -> tuple[StatusBody, bool]:
        """The status for `trueup doctor`, and whether the agent answered (if not with it:
        the status is then read from the state directory)."""
        self.client.timeout = STATUS_TIMEOUT
        try:
            response = self.client.request("GET", "/v1/status")
            status: StatusBody | None = _object(response) if response.status_code == 200 else None
        except (AgentUnavailable, ValueError):
            return self._local().doctor_status()
        if status is None:
            return self._local().doctor_status()[0], True
        return status, True

    def agent(self) -> AgentRecord:
        """The agent's own record in its status (`pid`, `version`, …); {} when it has none."""
        try:
            record: AgentRecord = self.client.request("GET", "/v1/status").json().get("agent", {})
        except (AgentUnavailable, ValueError, AttributeError):
            return {}
        return record

    def plan(self, document: DeviceState) -> PlanBody:
        plan: PlanBody = self._body(
            self.client.request("POST", "/v1/plan", json=document.canonical())
        )
        return plan

    def evidence(self) -> tuple[bytes, str]:
        """The evidence bundle and where it came from (the agent, else the state directory)."""
        self.client.timeout = EVIDENCE_TIMEOUT
        try:
            response = self.client.request("GET", "/v1/evidence")
            if response.status_code == 200:
                return response.content, "agent"
            why = f"the agent answered {response.status_code}: {response.text[:200]}"
        except AgentUnavailable as exc:
            why = f"the agent stopped answering: {exc.reason}"
        return self._local().evidence(why)

    # -- writes ------------------------------------------------------------------
    def apply(
        self,
        document: DeviceState,
        *,
        source: Path,
        mode: str,
        expect_version: int | None,
        confirm_within: float | None,
        override: str | None,
        init: bool,
    ) -> ApplyBody:
        del source, init  # the agent made its state directory; the document is the body
        headers = {"If-Match": str(expect_version)} if expect_version is not None else {}
        params: dict[str, str | float] = {"mode": mode, "actor": actor()}
        if confirm_within is not None:
            params["confirm_within"] = confirm_within
        if override is not None:
            params["override"] = override
        response = self.client.request(
            "POST", "/v1/apply", json=document.canonical(), headers=headers, params=params
        )
        return self._applied(response)

    def rollback(
        self, to: int | None, *, confirm_within: float | None, override: str | None
    ) -> ApplyBody:
        params: dict[str, str | float] = {"actor": actor()}
        if to is not None:
            params["to"] = to
        if confirm_within is not None:
            params["confirm_within"] = confirm_within
        if override is not None:
            params["override"] = override
        response = self.client.request("POST", "/v1/rollback", params=params)
        if response.status_code == 404:
            raise fail(_detail(response, "unknown revision"))
        return self._applied(response)

    def reconcile(self, subsystem: str | None) -> ApplyBody:
        params = {"subsystem": subsystem} if subsystem else {}
        response = self.client.request("POST", "/v1/reconcile", params=params)
        if response.status_code == 404:
            raise fail(_detail(response, "unknown subsystem"))
        return self._applied(response)

    def _applied(self, response: Response) -> ApplyBody:
        applied: ApplyBody = self._body(response)
        return applied

    def confirm(self) -> MessageBody:
        confirmed: MessageBody = self._body(self.client.request("POST", "/v1/confirm"))
        return confirmed

    def acknowledge(self, subsystem: str, seconds: float, reason: str) -> MessageBody:
        params: dict[str, str | float] = {
            "subsystem": subsystem,
            "seconds": seconds,
            "reason": reason,
            "actor": actor(),
        }
        return self._acknowledged(self.client.request("POST", "/v1/ack", params=params))

    def clear_acknowledgement(self, subsystem: str) -> MessageBody:
        params = {"subsystem": subsystem, "actor": actor()}
        return self._acknowledged(self.client.request("DELETE", "/v1/ack", params=params))

    def _acknowledged(self, response: Response) -> MessageBody:
        if response.status_code == 404:
            raise fail(_detail(response, "unknown subsystem"))
        acknowledged: MessageBody = self._body(response)
        return acknowledged

    def add_limitation(
        self, subsystem: str, path: str, *, reason: str, reviewed_by: str, ticket: str | None
    ) -> LimitationRecord:
        body = {
            "subsystem": subsystem,
            "path": path,
            "reason": reason,
            "reviewed_by": reviewed_by,
            "ticket": ticket,
            "actor": actor(),
        }
        return self._limitation(self.client.request("POST", "/v1/limitations", json=body))

    def withdraw_limitation(self, limitation_id: str, reason: str) -> LimitationRecord:
        response = self.client.request(
            "POST",
            f"/v1/limitations/{limitation_id}/withdraw",
            json={"reason": reason, "actor": actor()},
        )
        return self._limitation(response)

    def _limitation(self, response: Response) -> LimitationRecord:
        try:
            body = response.json()
        except ValueError:
            raise fail(f"agent answered {response.status_code}: {response.text[:200]}") from None
        if response.status_code >= 400:
            raise fail(str(body.get("detail") or body.get("message") or body))
        record: LimitationRecord = _object(response)
        return record

    def restore(
        self, archive: Path, mode: str, mappings: dict[str, str], *, reboot: bool
    ) -> RestoreRecord:
        body = {
            "archive": str(archive.absolute()),
            "mode": mode,
            "mappings": mappings,
            "reboot": reboot,
            "actor": actor(),
        }
        self.client.timeout = max(self.client.timeout, RESTORE_TIMEOUT, REQUEST_TIMEOUT)
        response = self.client.request("POST", "/v1/restore/apply", json=body)
        try:
            record: RestoreRecord | None = response.json()
        except ValueError:
            record = None
        if not isinstance(record, dict):
            # Not the agent's JSON (a proxy, a crash page): its status and text, never a traceback.
            echo(
                f"trueup restore apply: the agent answered HTTP {response.status_code} with a "
                f"body that is not JSON: {response.text[:2000].strip() or '(empty)'}; "
                "`trueup restore status` shows the record",
                err=True,
            )
            raise Failed(1)
        if response.status_code != 200:
            refusal: RestoreRefusal = response.json()
            failed = restore_failed(
                refusal.get("message") or refusal.get("detail") or response.text
            )
            if refusal.get("next"):
                echo(f"next: {refusal['next']}", err=True)
            raise failed
        return record
