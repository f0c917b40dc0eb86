"""The one front door of the CLI: what a verb asks of the router, and who answers it.

`Device` is every question and write a CLI verb puts to a router. Two answer
it: `AgentDevice` (`trueup.cli.agentdevice`), the running agent over its unix
socket; and `LocalDevice`, this process over the engine under the writer lock
(the same transaction an agent runs), for when no agent answers. A verb takes
`device_for(state_dir)` once and calls it once; what only an agent can do
(`confirm`, `ack`: the deadlines and acknowledgements live in the agent) the
local device refuses with the line to run next.

Both answer with the agent API's bodies (`trueup.cli.bodies`); a refusal is
printed and raised as `Failed` (the exit code: 1, or 3/4 for the refusal
codes of `trueup.model.reasons.EXIT_CODES`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from trueup.cli.agentdevice import AgentDevice, actor, fail, refused, restore_failed

if TYPE_CHECKING:
    from trueup.cli.bodies import (
        AgentRecord,
        ApplyBody,
        LimitationRecord,
        MessageBody,
        PlanBody,
        StatusBody,
    )
    from trueup.journal.restore import RestoreRecord
    from trueup.model.document import DeviceState
    from trueup.model.jsontypes import JSONObject
    from trueup.reconcile.engine import Engine

__all__ = ["Device", "LocalDevice", "device_for", "engine_for"]

NO_CONFIRM_WITHOUT_AGENT = (
    "--confirm-within needs a running agent to roll back on time (start it with `trueup agent run`)"
)


class Device(Protocol):
    """What a CLI verb asks of the router (`docs/agent-api.md` names the routes)."""

    def status(self) -> StatusBody:
        """The status document (`trueup status`, `trueup drift`)."""

    def doctor_status(self) -> tuple[StatusBody, bool]:
        """The status `trueup doctor` checks, and whether an agent answered it."""

    def agent(self) -> AgentRecord:
        """The answering agent's own record (`pid`, `version`); {} when none answers."""

    def plan(self, document: DeviceState) -> PlanBody:
        """What applying `document` would change, and who observed it."""

    def evidence(self) -> tuple[bytes, str]:
        """The runbook's evidence bundle and where it came from."""

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
        """Apply `document` (read from `source`) as one journaled transaction."""

    def rollback(
        self, to: int | None, *, confirm_within: float | None, override: str | None
    ) -> ApplyBody:
        """Apply an earlier accepted revision again."""

    def reconcile(self, subsystem: str | None) -> ApplyBody:
        """Converge now to the applied version."""

    def confirm(self) -> MessageBody:
        """Keep the version applied with a confirmation deadline."""

    def acknowledge(self, subsystem: str, seconds: float, reason: str) -> MessageBody:
        """Stop healing `subsystem` for `seconds`."""

    def clear_acknowledgement(self, subsystem: str) -> MessageBody:
        """Withdraw `subsystem`'s acknowledgement."""

    def add_limitation(
        self, subsystem: str, path: str, *, reason: str, reviewed_by: str, ticket: str | None
    ) -> LimitationRecord:
        """Record a known limitation; its record."""

    def withdraw_limitation(self, limitation_id: str, reason: str) -> LimitationRecord:
        """Withdraw a known limitation; its record."""

    def restore(
        self, archive: Path, mode: str, mappings: dict[str, str], *, reboot: bool
    ) -> RestoreRecord:
        """Start restoring `archive`; the restore record."""


def device_for(state_dir: Path, local: LocalDevice | None = None, *, write: bool = True) -> Device:
    """The running agent when it answers on `state_dir`'s socket now, else this process
    (`local`, which also answers the agent's reads when it stops answering).

    `write=False` for a verb that only reads: it skips the agent's health check
    (`trueup.cli.agentdevice.agent_client`)."""
    local = local or LocalDevice(state_dir)
    agent = AgentDevice.on(state_dir, write=write)
    if agent is None:
        return local
    agent.fallback = local
    return agent


def load_models() -> None:
    """The document model with every subsystem's section of `spec` registered."""
    import trueup.subsystems.registry  # noqa: F401


def engine_for(
    state_dir: Path,
    *,
    create: bool,
    init: bool = False,
    device: str | None = None,
    created_by: str | None = None,
) -> Engine:
    """The engine on a state directory its command already checked (trueup.cli.statedir)."""
    load_models()
    from trueup.journal.state import StateDir, StateDirError
    from trueup.reconcile.engine import Engine

    state = StateDir(state_dir)
    if create:
        from trueup.journal.agentlock import agent_holder

        holder = agent_holder(state.root)
        if holder is not None and holder.pid != os.getpid():
            # An agent runs on this state directory but did not answer on its
            # socket (hung, or starting): writing from here would observe and
            # change this process's namespace, perhaps not the router's.
            raise fail(
                f"an agent (pid {holder.pid}) runs on {state.root} but does not answer "
                f"on {state.root / 'agent.sock'}; nothing was changed. Check it (`trueup "
                "doctor`, its log) or stop it, then retry"
            )
    try:
        if create:
            state.ensure(
                created_by="trueup apply --init" if init else created_by,
                device=device,
                actor=actor(),
            )
        elif state.exists():
            state.check_schema()
    except (StateDirError, OSError) as exc:
        raise fail(str(exc)) from None
    return Engine(state)


def _served(status: JSONObject) -> StatusBody:
    """A status `trueup.reconcile.status.gather` built (`Status.to_json()`): the body an
    agent serves on `/v1/status`."""
    return cast("StatusBody", status)


class LocalDevice:
    """This process as the router's writer: the engine under the writer lock, no agent."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self._reader: Engine | None = None

    def reader(self) -> Engine:
        """An engine for reading whatever the state directory holds (no schema check):
        `evidence` and `doctor` work on a damaged one too."""
        if self._reader is None:
            load_models()
            from trueup.journal.state import StateDir
            from trueup.reconcile.engine import Engine

            self._reader = Engine(StateDir(self.state_dir))
        return self._reader

    def _absent(self) -> str:
        return f"no agent answers on {self.state_dir / 'agent.sock'}"

    # -- reads -------------------------------------------------------------------
    def status(self) -> StatusBody:
        engine = engine_for(self.state_dir, create=False)
        from trueup.journal.agentlock import agent_holder
        from trueup.reconcile.status import gather

        current = _served(gather(engine))
        # No agent answering: nothing heals, nothing reports upstream; `status` says so (exit 0).
        holder = agent_holder(self.state_dir)
        current["agent"] = {
            "running": holder is not None,
            "answering": False,
            "state_dir": str(self.state_dir),
            **({"pid": holder.pid} if holder else {}),
        }
        return current

    def doctor_status(self) -> tuple[StatusBody, bool]:
        from trueup.backup.evidence import recorded_control_plane_version
        from trueup.reconcile.status import gather

        engine = self.reader()
        version = recorded_control_plane_version(engine)
        return _served(gather(engine, control_plane_version=version)), False

    def agent(self) -> AgentRecord:
        return {}

    def plan(self, document: DeviceState) -> PlanBody:
        from trueup.reconcile.planning import plan_answer

        engine = engine_for(self.state_dir, create=False)
        answer = plan_answer(engine, document, previous=engine.applied_document(), agent_pid=None)
        return cast("PlanBody", answer.to_json())

    def evidence(self, why: str | None = None) -> tuple[bytes, str]:
        from trueup.backup.evidence import collect_evidence

        if why is None:
            why = f"no agent answered on {self.state_dir / 'agent.sock'} within its health timeout"
        source = f"state directory {self.state_dir}, read by `trueup evidence` ({why})"
        data = collect_evidence(self.reader(), source=source, missing={"live agent view": why})
        return data, source

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
        from trueup.reconcile.changes import Change, NeedsConfirmation, Refused

        if confirm_within is not None:
            raise fail(NO_CONFIRM_WITHOUT_AGENT)
        engine = engine_for(self.state_dir, create=True, init=init, device=document.metadata.device)
        try:
            result = engine.transact(
                Change.apply(
                    document,
                    origin="local-cli",
                    actor=actor(),
                    mode=mode,
                    expect_version=expect_version,
                    override=override,
                    source=str(source),
                )
            )
        except Refused as exc:
            raise refused(exc.code.value, str(exc)) from None
        except NeedsConfirmation as exc:
            raise fail(str(exc)) from None
        return cast("ApplyBody", result.to_json())

    def rollback(
        self, to: int | None, *, confirm_within: float | None, override: str | None
    ) -> ApplyBody:
        if confirm_within is not None:
            raise fail(NO_CONFIRM_WITHOUT_AGENT)
        from trueup.reconcile.changes import NeedsConfirmation, Refused, UnknownRevision

        engine = engine_for(self.state_dir, create=True)
        try:
            result = engine.rollback_to(to, actor=actor(), override=override)
        except Refused as exc:
            raise refused(exc.code.value, str(exc)) from None
        except (UnknownRevision, NeedsConfirmation) as exc:
            raise fail(str(exc)) from None
        return cast("ApplyBody", result.to_json())

    def reconcile(self, subsystem: str | None) -> ApplyBody:
        del subsystem  # without an agent, every subsystem converges in one transaction
        from trueup.reconcile.changes import Change, Refused

        engine = engine_for(self.state_dir, create=True)
        document = engine.applied_document()
        if document is None:
            raise fail("nothing applied yet; run `trueup apply FILE`")
        try:
            result = engine.transact(Change.heal(document, actor=actor()))
        except Refused as exc:
            raise refused(exc.code.value, str(exc)) from None
        return cast("ApplyBody", result.to_json())

    def confirm(self) -> MessageBody:
        raise fail(self._absent())

    def acknowledge(self, subsystem: str, seconds: float, reason: str) -> MessageBody:
        del subsystem, seconds, reason
        raise fail(
            f"{self._absent()}: acknowledgements are held by the running agent "
            "(start it: trueup agent run)"
        )

    def clear_acknowledgement(self, subsystem: str) -> MessageBody:
        return self.acknowledge(subsystem, 0.0, "")

    def add_limitation(
        self, subsystem: str, path: str, *, reason: str, reviewed_by: str, ticket: str | None
    ) -> LimitationRecord:
        from trueup.journal.limitations import LimitationError, add_limitation
        from trueup.subsystems.registry import default_subsystems

        try:
            record = add_limitation(
                self.state_dir,
                subsystem,
                path,
                reason=reason,
                reviewed_by=reviewed_by,
                ticket=ticket,
                actor=actor(),
                known_subsystems=[s.name for s in default_subsystems()],
            )
        except LimitationError as exc:
            raise fail(str(exc)) from None
        return cast("LimitationRecord", record.to_json())

    def withdraw_limitation(self, limitation_id: str, reason: str) -> LimitationRecord:
        from trueup.journal.limitations import LimitationError, withdraw_limitation

        try:
            record = withdraw_limitation(
                self.state_dir, limitation_id, reason=reason, actor=actor()
            )
        except LimitationError as exc:
            raise fail(str(exc)) from None
        except KeyError:
            raise fail(
                f"unknown limitation {limitation_id!r} (see `trueup limitation list --all`)"
            ) from None
        return cast("LimitationRecord", record.to_json())

    def restore(
        self, archive: Path, mode: str, mappings: dict[str, str], *, reboot: bool
    ) -> RestoreRecord:
        from trueup.backup.restore import RestoreRefused, start_restore
        from trueup.cli.backup import _links

        engine = engine_for(self.state_dir, create=True, created_by="trueup restore apply")
        links = _links()
        try:
            record = start_restore(
                engine, archive, mode, mappings, links, reboot=reboot, actor=actor()
            )
        except RestoreRefused as exc:
            raise restore_failed(exc) from None
        return record
