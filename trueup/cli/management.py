"""`trueup management show|set` — the console's and the installer's recovery path.

Works with the agent stopped, hung (holding the writer lock forever) or
crash-looping: it needs the kernel and the state directory, never the agent.

`set` converges the management tier alone — the management subsystem's own
plan and execute, nothing else — waits at most `--lock-wait` (1 s) for the
writer lock and goes on without it when a hung writer holds it (saying so,
and auditing it), then records the facts as an override in the state
directory (`management-override.json`, audit `management_set`) and in
`management.json` (the fast boot path's copy). The agent brings management up
from the override first at its next start (a running agent adopts it at its
next pass), reports it as version skew until a committed revision carries
the same facts, and then clears it.

`show` prints the facts the agent would bring up at its next start and where
they come from (and every source it would skip, and why), next to what the
kernel holds now.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from trueup.cli.statedir import StateDirOpt

if TYPE_CHECKING:
    from trueup.journal.state import StateDir
    from trueup.model.document import DeviceState
    from trueup.reconcile.engine import Engine

__all__ = ["management_app"]

management_app = typer.Typer(
    help="The management address from the console: works with the agent stopped, hung or "
    "crash-looping.",
    no_args_is_help=True,
)

OutputOpt = Annotated[str, typer.Option("-o", "--output", help="json | yaml | table")]
DEFAULT_DIR = Path("/var/lib/trueup")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"trueup management: {message}", err=True)
    return typer.Exit(code)


class ConsoleFacts(TypedDict):
    """Management facts: the interface, its addresses, the default gateway."""

    interface: str
    addresses: list[str]
    gateway: str | None


class ReplacedView(ConsoleFacts):
    source: str  # where the facts an override replaced were from


class KernelView(TypedDict, total=False):
    """What the kernel holds on the management interface now, or why it cannot be read."""

    interface: str | None
    error: str
    link: str
    addresses: list[str]
    default_routes: list[str]


def _kernel(engine: Engine, interface: str | None) -> KernelView:
    """What the kernel holds now on the management interface: link, addresses, default routes."""
    if interface is None:
        return {"interface": None}
    try:
        with engine.sources() as sources:
            netlink = sources.netlink
            links = {link.name: link for link in netlink.links()}
            addresses = sorted(a.prefix for a in netlink.addresses() if a.ifname == interface)
            routes = [
                f"{r.to} via {r.via}"
                for r in netlink.routes({254})
                if r.to in ("0.0.0.0/0", "::/0") and r.dev == interface
            ]
    except Exception as exc:  # show what it can; the kernel view is informative
        return {"interface": interface, "error": str(exc)}
    link = links.get(interface)
    return {
        "interface": interface,
        "link": link.state if link is not None else "absent",
        "addresses": addresses,
        "default_routes": sorted(routes),
    }


def _facts_line(interface: object, addresses: list[str] | None, gateway: object) -> str:
    line = f"{interface} {', '.join(addresses or []) or '-'}"
    if gateway:
        line += f" via {gateway}"
    return line


@management_app.command("show")
def show(
    state_dir: StateDirOpt = DEFAULT_DIR,
    config: Annotated[Path | None, typer.Option(help="the agent's --config")] = None,
    management_fallback: Annotated[
        Path | None, typer.Option(help="the agent's --management-fallback")
    ] = None,
    output: OutputOpt = "table",
) -> None:
    """The management facts the agent brings up at its next start, where from, and the kernel now."""
    from trueup.cli.output import emit
    from trueup.journal.agentlock import agent_holder
    from trueup.journal.state import StateDir
    from trueup.model.document import DocumentError, load_document
    from trueup.reconcile.engine import Engine
    from trueup.startup.sources import management_source

    state = StateDir(state_dir)
    engine = Engine(state)
    config_document = None
    if config is not None:
        try:
            config_document = load_document(config)
        except DocumentError as exc:
            typer.echo(f"{exc} (not used)", err=True)
    found = management_source(
        state,
        config=config_document,
        config_path=str(config) if config else None,
        fallback_path=management_fallback,
    )
    next_start = found.to_json()
    holder = agent_holder(state_dir) if state_dir.is_dir() else None
    damaged = [d.to_json() for d in engine.check.damaged()] if state_dir.is_dir() else []
    kernel = _kernel(engine, next_start["interface"])
    report = {
        "next_start": next_start,
        "kernel": kernel,
        "agent": {"running": holder is not None, **(holder.to_json() if holder else {})},
        "damaged": damaged,
    }
    if output != "table":
        emit(report, output)
        return
    if found.document is None:
        typer.echo("next start: NO management facts (nothing readable; see below)")
    else:
        api = next_start["api"]
        line = _facts_line(
            next_start.get("interface"), next_start.get("addresses"), next_start.get("gateway")
        )
        typer.echo(f"next start: {line} (API port {api['port'] if api else None})")
        typer.echo(f"  from {found.source}" + (f", over {found.base}" if found.base else ""))
    for why in found.skipped:
        typer.echo(f"  not used: {why}")
    if kernel.get("error"):
        typer.echo(f"kernel now: cannot observe: {kernel['error']}")
    elif kernel.get("interface"):
        typer.echo(
            f"kernel now: {kernel['interface']} {kernel['link']}, "
            f"{', '.join(kernel['addresses']) or 'no addresses'}"
            + (
                f"; default {', '.join(kernel['default_routes'])}"
                if kernel["default_routes"]
                else ""
            )
        )
    typer.echo(f"agent: running (pid {holder.pid})" if holder else "agent: not running")
    for damage in damaged:
        typer.echo(f"damaged: {damage['path']}: {damage['problem']}")


@management_app.command("set")
def set_management(
    interface: Annotated[str, typer.Option("--interface", help="the management interface")],
    address: Annotated[list[str], typer.Option("--address", help="ADDRESS/PREFIX (repeatable)")],
    gateway: Annotated[str | None, typer.Option(help="the management default gateway")] = None,
    state_dir: StateDirOpt = DEFAULT_DIR,
    reason: Annotated[str, typer.Option(help="why (audited)")] = "console recovery",
    lock_wait: Annotated[
        float, typer.Option(help="seconds to wait for the writer lock before going on without it")
    ] = 1.0,
) -> None:
    """Put the management address on the kernel now and keep it across agent restarts.

    Only the management tier is changed (interface up, addresses, default
    route); addresses trueup assigned to it before are removed once the new
    ones are on. Exit 0 applied and recorded; 1 not applied, or applied but not
    recorded (the message says which).
    """
    # The writer lock is waited for while the engine is imported (a few hundred
    # milliseconds): with a hung writer, the address is on the kernel about
    # `lock_wait` after the command started, not that plus the imports.
    locking = _LockAttempt(state_dir, lock_wait)
    import trueup.subsystems.registry  # noqa: F401  (sections of the document model)
    from trueup.journal.state import StateDir
    from trueup.model.document import DocumentError
    from trueup.reconcile.engine import Engine
    from trueup.reconcile.management_tier import document_from_facts
    from trueup.startup.sources import management_source
    from trueup.system.netlink import load_encoders

    load_encoders()
    facts: ConsoleFacts = {"interface": interface, "addresses": list(address), "gateway": gateway}
    state = StateDir(state_dir)
    engine = Engine(state)
    current = management_source(state) if state_dir.is_dir() else None
    previous = current.document if current is not None else None
    api = previous.spec.management.api.model_dump(mode="json") if previous is not None else None
    try:
        document = document_from_facts({**facts, "api": api}, source="trueup management set")
    except DocumentError as exc:
        locking.release()
        for problem in exc.problems:
            typer.echo(f"  {problem}", err=True)
        raise _fail("invalid management facts; nothing was changed") from None

    actor = f"console:{os.getuid()}"
    lock, lock_note = locking.result()
    try:
        steps = _converge(engine, document, previous)
        replaced = (
            _replaced(current.source, previous)
            if current is not None and previous is not None
            else None
        )
        recorded = _record(state, document, facts, actor, reason, lock_note, steps, replaced)
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)
    for step in steps:
        typer.echo(f"  {step}")
    typer.echo(
        f"management {_facts_line(interface, facts['addresses'], gateway)}: on the kernel now"
        + (f" ({len(steps)} step(s))" if steps else " (already there)")
    )
    if lock_note != "held":
        typer.echo(f"  writer lock {lock_note}", err=True)
    _finish_announcements()
    from trueup.journal.agentlock import agent_holder

    holder = agent_holder(state_dir) if state_dir.is_dir() else None
    if recorded is not None:
        typer.echo(
            f"NOT recorded ({recorded}): the kernel has it now, but an agent start would not "
            "keep it. Make the state directory writable and run this again.",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(
        f"recorded in {state.root}/management-override.json (audited): "
        + (
            f"the running agent (pid {holder.pid}) adopts it at its next pass"
            if holder
            else "the agent brings it up first at its next start"
        )
        + "; reported as version skew until a revision carries these facts"
    )


def _finish_announcements(bound: float = 3.0) -> None:
    """Let the spaced gratuitous ARP / neighbour advertisements go out before exiting."""
    deadline = time.monotonic() + bound
    for thread in threading.enumerate():
        if thread.name == "trueup-announce":
            thread.join(max(0.0, deadline - time.monotonic()))


def _replaced(source: str, document: DeviceState) -> ReplacedView:
    from trueup.reconcile.management_tier import management_facts_of

    facts = management_facts_of(document)
    interface, addresses, gateway = facts["interface"], facts["addresses"], facts["gateway"]
    return {"source": source, "interface": interface, "addresses": addresses, "gateway": gateway}


class _LockAttempt:
    """The writer lock, taken on a thread within `wait` seconds (or why it was not)."""

    def __init__(self, state_dir: Path, wait: float) -> None:
        from trueup.journal.lock import WriterLock  # standard library only

        self.wait = max(0.0, wait)
        self._lock = WriterLock(state_dir / "lock", "management set", self.wait)
        self._outcome: tuple[Any, str] = (None, "not taken")
        self._thread = threading.Thread(target=self._take, name="management-set-lock")
        self._thread.start()

    def _take(self) -> None:
        from trueup.journal.lock import LockBusy, LockError

        try:
            self._lock.__enter__()
        except LockBusy as exc:
            holder = exc.holder
            self._outcome = (
                None,
                f"bypassed: held by pid {holder.get('pid')} ({holder.get('purpose')}) for "
                f"more than {self.wait:g}s; a hung writer must not keep management down",
            )
        except (LockError, OSError) as exc:
            self._outcome = (None, f"not taken: {exc}")
        else:
            self._outcome = (self._lock, "held")

    def result(self) -> tuple[Any, str]:
        self._thread.join()
        return self._outcome

    def release(self) -> None:
        lock, _ = self.result()
        if lock is not None:
            lock.__exit__(None, None, None)


def _converge(engine: Engine, document: Any, previous: Any) -> list[str]:
    """Converge the management tier alone; exit 1 with the reason when the kernel refuses.

    The engine's one converge, management only; its audit line is `management_set`,
    written once the override is recorded (`_record`), so none is written here.
    """
    from trueup.reconcile.engine.converge import converge_management
    from trueup.subsystems.base import StepError
    from trueup.system.netlink import NetlinkError

    try:
        done = converge_management(engine, document, previous, actor="console", audit=False)
    except (StepError, NetlinkError, OSError, ValueError) as exc:
        raise _fail(f"not applied: {exc}; the state directory was not changed") from None
    return done.described()


def _record(
    state: StateDir,
    document: Any,
    facts: ConsoleFacts,
    actor: str,
    reason: str,
    lock_note: str,
    steps: list[str],
    replaced: ReplacedView | None,
) -> str | None:
    """The override, the fast path's copy and the audit line; None, or why it was not recorded."""
    from trueup.journal.audit import now_iso
    from trueup.journal.management import management_facts, write_management
    from trueup.journal.override import (
        ManagementFacts,
        ManagementOverride,
        ReplacedFacts,
        write_override,
    )

    try:
        record = ManagementOverride(
            facts=ManagementFacts.from_json(facts),
            set_at=now_iso(),
            actor=actor,
            reason=reason,
            writer_lock=lock_note,
            replaced=ReplacedFacts.from_json(replaced) if replaced is not None else None,
        )
        state.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_override(state.root, record)
    except (OSError, ValueError) as exc:
        return str(exc)
    problems: list[str] = []
    try:
        # The fast boot path's copy, so the next start brings these facts up first.
        write_management(
            state.root,
            management_facts(
                document.spec.management.model_dump(mode="json"), version=None, digest=None
            ),
        )
    except (OSError, ValueError) as exc:
        problems.append(f"management.json not written: {exc}")
    try:
        state.audit.append(
            "management_set",
            actor,
            **facts,
            reason=reason,
            writer_lock=lock_note,
            steps=steps,
            replaced=replaced,
        )
    except OSError as exc:
        problems.append(f"audit line not written: {exc}")
    for problem in problems:
        typer.echo(f"  warning: {problem}", err=True)
    return None
