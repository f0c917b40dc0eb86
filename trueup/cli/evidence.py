"""`trueup evidence` and `trueup doctor` — the runbook from the console.

Both work with the agent stopped or hung: they ask the agent first
(with a short timeout) and otherwise read the state directory directly.

* `evidence --out FILE` — the bundle (`trueup.backup.evidence`); the
  manifest says where it came from and which parts are missing and why.
* `doctor` — every safe check of the runbook, each finding with its code and
  corrective action; exit 1 when any fails, including when no agent runs.
  `doctor --until-stable 5m` waits until the stop conditions (desired equals
  observed, versions aligned, no reconciliation error, an agent running) hold
  for the whole window; exit 0 then, 1 at `--timeout`, naming what is not met.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from trueup.cli.commands import OUTPUT
from trueup.cli.device import LocalDevice, device_for
from trueup.cli.exitcodes import command_option, option
from trueup.cli.statedir import StateDirOpt, require_state_dir

if TYPE_CHECKING:
    from trueup.cli.bodies import StatusBody
    from trueup.reconcile.doctor import AgentPresence
    from trueup.reconcile.engine import Engine

__all__ = ["doctor", "evidence", "require_state_dir"]

OutputOpt = Annotated[str, option(OUTPUT)]
DEFAULT_DIR = Path("/var/lib/trueup")


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"trueup: {message}", err=True)
    raise typer.Exit(code)


def _presence(state_dir: Path, answered: bool) -> AgentPresence:
    from trueup.journal.agentlock import agent_holder
    from trueup.reconcile.doctor import AgentPresence

    holder = agent_holder(state_dir)
    pid = holder.pid if holder and holder.pid else None
    return AgentPresence(running=pid is not None, answering=answered, pid=pid)


# -- evidence ----------------------------------------------------------------------
def evidence(
    out: Annotated[Path, command_option("evidence", "out")],
    state_dir: StateDirOpt = DEFAULT_DIR,
    upload: Annotated[bool, command_option("evidence", "upload")] = False,
    control_plane: Annotated[str | None, command_option("evidence", "control_plane")] = None,
    token_file: Annotated[Path | None, command_option("evidence", "token_file")] = None,
) -> None:
    data, source = device_for(state_dir).evidence()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    typer.echo(f"wrote {out} ({len(data)} bytes) from the {source.split(',')[0]}")
    for name, reason in _missing(data).items():
        typer.echo(f"  missing {name}: {reason}")
    if upload:
        _upload(out, state_dir, control_plane, token_file, source)


def _upload(
    out: Path, state_dir: Path, control_plane: str | None, token_file: Path | None, source: str
) -> None:
    """Upload the written bundle with the device's credential (the agent's control plane)."""
    import json

    from trueup.agent.cpclient import ControlPlaneClient, ControlPlaneError

    if control_plane is None:
        try:
            recorded = json.loads((state_dir / "control-plane.json").read_text())
            control_plane = str(recorded["url"])
        except (OSError, ValueError, KeyError, TypeError):
            _fail(
                "trueup evidence --upload: the agent is not enrolled with a control plane "
                f"({state_dir / 'control-plane.json'} names none); give --control-plane URL"
            )
    if token_file is None:
        _fail("trueup evidence --upload: give --token-file F (the agent's device credential)")
    client = ControlPlaneClient(control_plane, token_file)
    try:
        stored = client.upload_evidence(out, {"source": source.split(",")[0]})
    except ControlPlaneError as exc:
        _fail(f"trueup evidence --upload: the upload failed: {exc}")
    finally:
        client.close()
    typer.echo(
        f"uploaded evidence {stored['id']} of {stored['device']}: {stored['size']} bytes, "
        f"sha256 {stored['sha256']}"
    )


def _missing(data: bytes) -> dict[str, str]:
    """The manifest's `missing` parts (what could not be collected, and why)."""
    import io
    import json
    import tarfile

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            member = tar.extractfile("evidence/manifest.json")
            manifest = json.loads(member.read()) if member is not None else {}
    except (tarfile.TarError, KeyError, ValueError) as exc:
        return {"manifest.json": f"unreadable: {exc}"}
    return dict(manifest.get("missing") or {})


# -- doctor ------------------------------------------------------------------------
def _snapshot(state_dir: Path) -> tuple[StatusBody, AgentPresence, Engine]:
    local = LocalDevice(state_dir)
    status, answered = device_for(state_dir, local).doctor_status()
    return status, _presence(state_dir, answered), local.reader()


def _report(state_dir: Path) -> tuple[list[Any], StatusBody, AgentPresence]:
    from trueup.reconcile.doctor import run_checks
    from trueup.startup.preflight import preflight
    from trueup.subsystems.registry import default_subsystems
    from trueup.system.hostinfo import agent_log_lines

    status, presence, engine = _snapshot(state_dir)
    lines, where = agent_log_lines(state_dir, presence.pid)
    blockers = [
        (f.check, f.message)
        for f in preflight(state_dir, default_subsystems(), agent_pid=presence.pid)
        if f.severity == "blocker"
    ]
    findings = run_checks(
        dict(status),
        presence,
        log_lines=lines if where.get("source") else None,
        log_source=where.get("source") or where.get("missing"),
        tampered=engine.state.tampered_revisions(),
        audit_problems=[str(p) for p in engine.state.audit.verify()],
        blockers=blockers,
    )
    return findings, status, presence


def _print_findings(findings: list[Any]) -> None:
    for f in findings:
        head = f"{'ok  ' if f.ok else 'FAIL'} {f.check}: {f.message}"
        typer.echo(head)
        if not f.ok:
            typer.echo(
                f"       {f.code}" + (f" [{f.subsystem}]" if f.subsystem else "") + f": {f.action}"
            )
            for path in f.paths[:10]:
                typer.echo(f"       path: {path}")


def doctor(
    state_dir: StateDirOpt = DEFAULT_DIR,
    output: OutputOpt = "table",
    until_stable: Annotated[str | None, command_option("doctor", "until_stable")] = None,
    timeout: Annotated[str | None, command_option("doctor", "timeout")] = None,
) -> None:
    from trueup.cli.fast import duration_seconds

    if until_stable is not None:
        window = duration_seconds(until_stable)
        if window is None:
            _fail(f"--until-stable: {until_stable!r}: expected a duration like 90s, 5m")
        limit = duration_seconds(timeout) if timeout else 2 * window + 60
        if limit is None:
            _fail(f"--timeout: {timeout!r}: expected a duration like 90s, 15m")
        raise typer.Exit(_until_stable(state_dir, window, limit))
    findings, status, _ = _report(state_dir)
    ok = all(f.ok for f in findings)
    if output != "table":
        from trueup.cli.output import emit

        emit({"ok": ok, "findings": [f.to_json() for f in findings]}, output)
    else:
        _print_findings(findings)
        from trueup.cli.statustable import render_limitations

        for line in render_limitations(status):
            typer.echo(line)
        failed = [f for f in findings if not f.ok]
        typer.echo(f"\n{len(failed)} problem(s)" if failed else "\nhealthy: every check passed")
    raise typer.Exit(0 if ok else 1)


def _until_stable(state_dir: Path, window: float, limit: float) -> int:
    from trueup.reconcile.doctor import stop_conditions

    start = time.monotonic()
    stable_since: float | None = None
    poll = max(0.5, min(5.0, window / 4))
    tty = sys.stdout.isatty()
    conditions: dict[str, tuple[bool, str]] = {}
    typer.echo(f"waiting until the stop conditions hold for {window:g}s (timeout {limit:g}s)")
    while True:
        status, presence, _ = _snapshot(state_dir)
        conditions = stop_conditions(dict(status), presence)
        now = time.monotonic()
        if all(met for met, _ in conditions.values()):
            stable_since = stable_since if stable_since is not None else now
        else:
            stable_since = None
        quiet = 0.0 if stable_since is None else now - stable_since
        unmet = [f"{name}: {seen}" for name, (met, seen) in conditions.items() if not met]
        line = f"[{now - start:5.0f}s] stable for {quiet:.0f}s of {window:g}s" + (
            f"; not met: {'; '.join(unmet)}" if unmet else "; all conditions met"
        )
        typer.echo(("\r" + line[:200].ljust(120)) if tty else line, nl=not tty)
        if stable_since is not None and quiet >= window:
            typer.echo(("\n" if tty else "") + f"stable: every stop condition held for {window:g}s")
            return 0
        if now - start >= limit:
            if tty:
                typer.echo("")  # end the progress line
            typer.echo(f"not stable after {limit:g}s:", err=True)
            for name, (met, seen) in conditions.items():
                typer.echo(f"  {'met    ' if met else 'NOT MET'} {name}: {seen}", err=True)
            return 1
        time.sleep(poll)
