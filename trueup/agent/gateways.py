"""The gateway monitor: probes each uplink, and switches the default routes at once.

Who calls this: `trueup.agent.wiring`, which starts it in phase 4 when the
agent runs the gateways subsystem. It feeds the subsystem's board
(`trueup.subsystems.gateways.board`): one thread per uplink sends a probe
round every `interval_ms` (`trueup.system.probe`, bound to the uplink), and
each round goes through the uplink's state machine. A state change is
audited (`gateway_state`), and when it changes the decision the routes are
switched right away through the engine's `converge_gateways` (audited
`gateway_switched`): the monitor is a writer outside `Engine.transact`, so
a switch never waits for the writer lock or a reconcile pass, and it never
touches the management default route (the converge refuses it). The
reconcile loop heals drift of the same routes from the same facts.

A supervisor thread follows the applied revision (`Engine.applied_document`,
read every `FOLLOW_SECONDS`): the board keeps the state of uplinks whose
probe settings are unchanged, so a new document converges without a flap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from trueup.model.document import DeviceState
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.converge import converge_gateways
from trueup.subsystems.gateways.board import Board, Transition
from trueup.subsystems.gateways.health import Decision, RoundResult
from trueup.subsystems.gateways.section import GatewaysSection, Uplink
from trueup.subsystems.gateways.subsystem import installed_decision
from trueup.subsystems.registry import scope_for
from trueup.system.probe import ProbeTarget, probe_round

__all__ = ["FOLLOW_SECONDS", "GatewayMonitor", "Prober"]

log = logging.getLogger("trueup.agent")

FOLLOW_SECONDS = 0.5
ACTOR = "gateway-monitor"

Prober = Callable[[str, list[ProbeTarget], float, int], tuple[float | None, ...]]


def targets_of(uplink: Uplink) -> list[ProbeTarget]:
    return [ProbeTarget(a) for a in uplink.probes.icmp] + [
        ProbeTarget(host, port) for host, port in uplink.probes.tcp_targets()
    ]


def _choices(decision: Decision | None) -> dict[int, tuple[str, ...]]:
    return {f: c.members for f, c in decision.choices.items()} if decision is not None else {}


class GatewayMonitor:
    def __init__(
        self,
        engine: Engine,
        board: Board,
        *,
        prober: Prober = probe_round,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.board = board
        self.prober = prober
        self.clock = clock
        # Called after each audited transition (the control-plane report, the loop's view).
        self.on_change: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._workers: dict[tuple[str, tuple[object, ...]], threading.Thread] = {}
        self._document: DeviceState | None = None
        self._switching = threading.Lock()
        self._thread: threading.Thread | None = None

    def seed(self) -> None:
        """Before the first probe verdicts, keep the uplinks the kernel's routes go through.

        Called before the startup converges the applied revision: an agent restarted
        mid-failover keeps the route on the secondary instead of moving it to the first
        priority, which may be the uplink that is down, until the probes say otherwise.
        """
        document = self.engine.applied_document()
        section = document.spec.section("gateways", GatewaysSection) if document else None
        if document is None or section is None:
            return
        subsystem = self.engine.by_name["gateways"]
        scope = scope_for(document)
        with self.engine.sources() as net:
            observed = subsystem.observe(net, scope)
        self._document = document
        self.board.sync(section)
        decision = installed_decision(document, observed)
        if decision is not None:
            self.board.remember(decision)
            log.info("gateways: until the first verdicts, keeping %s", decision.active())

    def start(self) -> None:
        self.board.monitoring = True
        self._thread = threading.Thread(target=self._follow, name="trueup-gateways", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.board.monitoring = False

    # -- the applied document -------------------------------------------------------
    def _follow(self) -> None:
        last_problem = ""
        while not self._stop.is_set():
            try:
                self.follow_once()
                last_problem = ""
            except Exception as exc:  # the monitor never ends on a bad read; the next look retries
                if str(exc) != last_problem:  # logged once, not every look
                    log.exception("gateway monitor: following the applied revision failed")
                last_problem = str(exc)
            self._stop.wait(FOLLOW_SECONDS)

    def follow_once(self) -> None:
        """Sync the board to the applied revision; start and end the uplinks' probe threads."""
        section = self.sync()
        wanted = {(u.name, u.probe_settings()): u for u in (section.uplinks if section else [])}
        for key in list(self._workers):
            if key not in wanted or not self._workers[key].is_alive():
                del self._workers[key]  # a worker whose settings are gone ends by itself
        for key, uplink in wanted.items():
            if key not in self._workers:
                worker = threading.Thread(
                    target=self._probe,
                    args=(uplink, key[1]),
                    name=f"trueup-gw-{uplink.name}",
                    daemon=True,
                )
                self._workers[key] = worker
                worker.start()

    def sync(self) -> GatewaysSection | None:
        """The board follows the applied revision (kept trackers: see the module docstring)."""
        document = self.engine.applied_document()
        section = document.spec.section("gateways", GatewaysSection) if document else None
        if document is not self._document:
            self._document = document
            self.board.sync(section)
            with self.board.deciding():
                pass  # the apply installed what this decision says
        return section

    # -- one uplink -----------------------------------------------------------------
    def _probe(self, uplink: Uplink, settings: tuple[object, ...]) -> None:
        targets = targets_of(uplink)
        interval = uplink.interval_ms / 1000.0
        seq = 0
        next_round = time.monotonic()
        while not self._stop.is_set() and (uplink.name, settings) in self._workers:
            seq += 1
            try:
                latencies = self.prober(uplink.interface, targets, uplink.timeout_seconds, seq)
            except Exception as exc:  # a probe that cannot be sent is a round without answers
                log.debug("gateway %s: probe round failed: %s", uplink.name, exc)
                latencies = tuple(None for _ in targets)
            self.round(uplink.name, settings, RoundResult(latencies))
            next_round += interval
            self._stop.wait(max(0.0, next_round - time.monotonic()))
            if time.monotonic() - next_round > interval:
                next_round = time.monotonic()  # a stall (a suspended VM): no burst of rounds

    def round(self, name: str, settings: tuple[object, ...], result: RoundResult) -> None:
        """One probe round of uplink `name`: its state, and the routes when they change."""
        transition = self.board.observe(name, settings, result, self.clock())
        if transition is not None:
            self.transition(transition)

    def transition(self, transition: Transition) -> None:
        """Audit an uplink's state change and switch the routes when the decision changes."""
        document = self._document
        with self._switching, self.board.deciding() as (previous, decision):
            self._audit(
                "gateway_state",
                gateway=transition.gateway,
                previous=transition.before,
                state=transition.after,
            )
            if document is not None and _choices(previous) != _choices(decision):
                self._switch(document, previous, decision)
        for callback in self.on_change:
            try:
                callback()
            except Exception:
                log.exception("gateway monitor: change callback failed")

    def _switch(
        self, document: DeviceState, previous: Decision | None, decision: Decision | None
    ) -> None:
        before = {f"ipv{f}": list(m) for f, m in sorted(_choices(previous).items())}
        after = {f"ipv{f}": list(m) for f, m in sorted(_choices(decision).items())}
        all_down = sorted(
            f"ipv{f}" for f, c in (decision.choices.items() if decision else ()) if c.all_down
        )
        try:
            steps, problem = converge_gateways(
                self.engine, document, actor=ACTOR, previous=before, active=after, all_down=all_down
            )
        except Exception as exc:  # the loop heals what the switch could not do
            if self._switched(document):
                # The default routes moved; a probe route waits for its link (the loop
                # puts it back when the link returns).
                self._audit(
                    "gateway_switched",
                    previous=before,
                    active=after,
                    all_down=all_down,
                    problem=str(exc),
                )
                return
            log.error("gateway switch %s -> %s failed: %s", before, after, exc)
            self._audit("gateway_switch_failed", previous=before, active=after, error=str(exc))
            return
        if problem is not None:
            log.warning("gateway_switched not audited: %s", problem)
        log.info("gateways: %s -> %s (%d steps)", before, after, len(steps))

    def _switched(self, document: DeviceState) -> bool:
        """Whether every owned table's default route is the one the decision implies."""
        subsystem = self.engine.by_name["gateways"]
        scope = scope_for(document)
        try:
            with self.engine.sources() as net:
                observed = subsystem.observe(net, scope)
        except Exception:
            return False
        desired = subsystem.desired(document, scope)
        tables = [path for path in desired if path.startswith("spec.gateways.tables[")]
        return all(observed.get(path) == desired[path] for path in tables)

    def _audit(self, event: str, **details: object) -> None:
        try:
            self.engine.state.audit.append(event, ACTOR, **details)
        except OSError as exc:  # a full state directory never stops a switch
            log.warning("%s not audited: %s", event, exc)
