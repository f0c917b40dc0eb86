"""Wires the optional parts of an agent: the reconcile loop and the control-plane sync.

Both start in phase 4, after management, recovery and the subsystems: the
control plane is never a prerequisite for management, and while it is
unreachable the agent keeps enforcing its last accepted revision.

A revision delivered with a confirmation window is applied with
`--confirm-within` semantics and confirmed by the agent itself once its
health holds (`trueup.agent.selfconfirm`); the first revision a device
receives has nothing to return to and is applied without it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trueup.agent.cpclient import ControlPlaneClient, RetryLater, report_from_status
from trueup.agent.cpsync import SyncLoop
from trueup.agent.gateways import GatewayMonitor
from trueup.agent.process import Agent
from trueup.agent.reportwatch import StatusWatch, operator_facts
from trueup.agent.selfconfirm import SelfConfirm
from trueup.model.document import document_digest, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import ReasonCode
from trueup.model.records import Applied
from trueup.reconcile.changes import CONTROL_PLANE_FILE, Refused, StorageError
from trueup.reconcile.healing import HealingOptions
from trueup.reconcile.loop import ReconcileLoop
from trueup.subsystems.gateways.board import Board
from trueup.system.safefile import open_file
from trueup.system.secretstore import SecretError, secret_references, write_secret

__all__ = ["CONTROL_PLANE_FILE", "already_applied", "wire"]

log = logging.getLogger("trueup.agent")


def already_applied(applied: Applied, version: int, digest: str) -> bool:
    """Whether control-plane revision `version` needs no apply.

    Decided by identity, not by number: a revision is applied when the last
    one applied *from the control plane* is at least as new. A local apply
    that took the same number does not count; a local override holds only
    until the next desired revision.
    """
    if applied.cp_version is not None:
        return applied.cp_version >= version
    # A state directory from before revisions had an origin: same number and
    # same document is the only proof.
    return applied.version == version and applied.digest == digest


def _control_plane_record(agent: Agent) -> dict[str, Any] | None:
    """`control-plane.json`, {} when absent; None when damaged (reported; never overwritten)."""
    try:
        record = agent.state.read(CONTROL_PLANE_FILE, {}) if agent.state.exists() else {}
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return None
    return dict(record) if isinstance(record, dict) else None


def _reconcile_loop(agent: Agent) -> ReconcileLoop:
    """The agent's loop: woken by the subsystems' watches, options from `TRUEUP_*` variables."""
    from trueup.system.watches import event_source_for

    engine = agent.engine
    events = event_source_for(
        (w for sub in engine.subsystems for w in sub.watches), engine.state.root
    )
    return ReconcileLoop(engine, options=HealingOptions.from_env(), events=events)


def _fetch_secrets(client: ControlPlaneClient, state_dir: Path, document: JSONObject) -> None:
    """Store the secrets `document` refers to (`{secret_ref: NAME}`, `"secret:NAME"`) from the
    control plane into `STATE_DIR/secrets`, before the revision is applied.

    Only the referenced ones are written. A failure is logged by name and
    never blocks the revision: the subsystem that needs a missing secret
    fails alone, saying which and where to put it.
    """
    wanted = secret_references(document)
    if not wanted:
        return
    try:
        answer = client.secrets()
    except Exception as exc:  # the revision is applied anyway; the subsystem reports the gap
        log.warning("control-plane secrets not fetched (%s): %s", ", ".join(sorted(wanted)), exc)
        return
    values = answer.get("secrets") or {}
    # Secrets the control plane holds but will not serve (a row that does not open, or
    # one that is not the newest audited version): logged with its reason.
    refused = {
        str(item.get("name")): str(item.get("error"))
        for item in answer.get("refused") or []
        if isinstance(item, dict)
    }
    for name in sorted(wanted):
        value = values.get(name)
        if not isinstance(value, str):
            if name in refused:
                log.error("control plane refused secret %r: %s", name, refused[name])
            else:
                log.warning("control plane holds no secret %r for this device", name)
            continue
        try:
            write_secret(state_dir, name, value)
        except (SecretError, OSError) as exc:
            log.warning("secret %r not stored: %s", name, exc)


def _write_private_bytes(path: Path, data: bytes) -> None:
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _start_sync(agent: Agent, url: str, token_file: Path, heartbeat: float) -> SyncLoop:
    state = agent.state
    client = ControlPlaneClient(url, token_file)

    def apply(
        document: JSONObject, version: int, /, *, confirm_within: float | None = None
    ) -> None:
        agent.control_plane_version = version
        agent.engine.refuse_if_damaged()  # before control-plane.json is written
        state.write(CONTROL_PLANE_FILE, {"url": url, "version": version})
        parsed = parse_document(document, f"control-plane revision {version}")
        parsed = parsed.with_version(version)
        _fetch_secrets(client, state.root, document)
        if already_applied(state.applied(), version, document_digest(parsed)):
            return  # already there (a restart, or a re-poll)
        window = confirm_within
        if window is not None and not state.applied().version:
            log.warning(
                "control-plane revision %d: nothing applied yet to roll back to; "
                "applied without its %gs confirmation window",
                version,
                window,
            )
            window = None
        try:
            result = agent.requests.apply(
                parsed, actor="control-plane", origin="control-plane", confirm_within=window
            )
        except StorageError as exc:
            raise RetryLater(str(exc)) from exc
        except Refused as exc:
            if exc.code is ReasonCode.CONCURRENT_MODIFICATION:
                raise RetryLater(str(exc)) from exc
            raise
        if not result.get("ok"):
            raise RuntimeError(
                result.get("message") or f"{result.get('outcome')}: {result.get('failed')}"
            )

    sync = SyncLoop(
        client,
        apply,
        lambda: report_from_status(agent.status().to_json()),
        heartbeat_interval=heartbeat,
        # Long-poll after the last revision applied from the control plane, never
        # after a number a local apply took.
        initial_version=(state.applied().cp_version or 0),
        build_evidence=lambda path: _write_private_bytes(path, agent.evidence()),
    )
    sync.start()
    return sync


def _gateway_monitor(agent: Agent) -> GatewayMonitor | None:
    """The gateway monitor, when the agent runs the gateways subsystem (started in phase 4)."""
    subsystem = agent.engine.by_name.get("gateways")
    board = getattr(subsystem, "board", None)
    if not isinstance(board, Board):
        return None
    monitor = GatewayMonitor(agent.engine, board)
    try:
        monitor.seed()  # before recovery and the subsystem phase converge the routes
    except Exception:  # a damaged state directory or a netlink error: start from pending
        log.exception("gateways: reading the installed routes failed")

    def start(agent: Agent) -> None:
        monitor.start()
        agent.on_stop.append(monitor.stop)
        if agent.loop is not None:
            # A switch shows in the loop's view (and so in the report) at once.
            monitor.on_change.append(agent.loop.wake)

    agent.on_steady.append(start)
    return monitor


def wire(
    agent: Agent,
    *,
    control_plane: str | None,
    token_file: Path | None,
    heartbeat: float = 30.0,
) -> None:
    agent.loop_factory = _reconcile_loop
    gateways = _gateway_monitor(agent)
    if control_plane is None and token_file is None:
        return
    if control_plane is None or token_file is None:
        raise SystemExit("trueup: --control-plane and --token-file go together")
    saved = _control_plane_record(agent) or {}
    if saved.get("version"):
        # Known before the control plane answers: version skew shows at once.
        agent.control_plane_version = int(saved["version"])

    def start(agent: Agent) -> None:
        current = _control_plane_record(agent)
        if current is not None and current.get("url") != control_plane:
            # From now on local applies are overrides (the engine reads this file).
            agent.state.write(CONTROL_PLANE_FILE, {**current, "url": control_plane})
        sync = _start_sync(agent, control_plane, token_file, heartbeat)
        agent.sync = sync
        agent.on_stop.append(sync.stop)
        if agent.loop is not None:
            # A writer fighting management is reported upstream at once, not at the heartbeat.
            agent.loop.on_fought.append(sync.request_report)
            confirmer = SelfConfirm(
                agent.loop,
                management=agent.management_health,
                contact=lambda: sync.last_contact_at,
                contact_problem=lambda: None if sync.connected else sync.last_error,
                ask_contact=sync.request_report,
            )
            confirmer.start()
            agent.on_stop.append(confirmer.stop)
        # Whatever an operator sees changing is reported then (coalesced), not at the
        # heartbeat: what the loop shows, and fences, transactions, restores, management.
        if gateways is not None:
            # Every gateway transition is reported upstream then, not at the heartbeat.
            gateways.on_change.append(sync.request_report)
        watch = StatusWatch(lambda: operator_facts(agent), sync.request_report)
        if agent.loop is not None:
            agent.loop.on_change.append(watch.poke)
        watch.start()
        agent.on_stop.append(watch.stop)

    agent.on_steady.append(start)
