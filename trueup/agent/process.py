"""The agent process: wires the startup orchestrator, the API listeners and the loops.

Who calls this: `trueup agent run`. Phase 0 (load) and phase 1 (management)
run before anything else; the API then serves on the unix socket and on the
management port; recovery, subsystems and the reconcile loop follow on a
background thread, so no later work can hold management hostage.

An operator's requests (apply, rollback, plan, confirm, reconcile, ack) take
one route, `Agent.requests` (`trueup.reconcile.requests`): into the reconcile
loop once it runs, to the engine before.

Why this module is over 400 lines: it is the agent's process — what it
reports (health, status, metrics), listeners with their fallback and
handover, systemd notification and the startup thread — kept together
because they share the agent's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from trueup.agent.api import create_app, hash_token, token_matches
from trueup.agent.bodies import (
    AgentExtras,
    ListenerRecord,
    ManagementHealth,
    ServiceHealth,
    ServicesHealth,
    StateDirectoryHealth,
)
from trueup.agent.early import bind_tcp, bind_unix, listener_key
from trueup.agent.metrics import AgentMetrics
from trueup.agent.restoring import restore_resume
from trueup.backup.evidence import collect_evidence
from trueup.journal.agentlock import AgentLock, AgentRunning, take_agent_lock
from trueup.journal.atomic import StateFileError
from trueup.journal.audit import now_iso
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState
from trueup.model.status import Status
from trueup.model.virtual import is_virtual, virtual_addresses
from trueup.reconcile.engine import Engine
from trueup.reconcile.loop import ReconcileLoop
from trueup.reconcile.requests import Requests
from trueup.reconcile.status import AgentInfo, build_status, drift_report
from trueup.startup.orchestrator import Orchestrator
from trueup.subsystems.base import Subsystem
from trueup.system.daemon import DaemonSupervisor
from trueup.system.notify import Notifier, watchdog_interval
from trueup.system.sockets import sweep

__all__ = ["Agent", "create_api_token"]

log = logging.getLogger("trueup.agent")


def _sweep_sockets() -> None:
    """Daemon socket directories under /run/trueup whose state directory is gone."""
    try:
        removed = sweep()
    except OSError as exc:
        log.warning("socket directories not swept: %s", exc)
        return
    if removed:
        log.info("removed %d socket directories of gone state directories", len(removed))


TOKENS_FILE = "api-tokens.json"


def create_api_token(state: StateDir, name: str) -> str:
    """A new bearer token for the management port; only its hash is stored."""
    state.ensure()
    token = "tu_" + secrets.token_urlsafe(32)
    tokens = state.read(TOKENS_FILE, [])
    tokens = [t for t in tokens if t.get("name") != name]
    tokens.append({"name": name, "hash": hash_token(token), "created_at": now_iso()})
    state.write(TOKENS_FILE, tokens)
    state.audit.append("api_token_created", "local", name=name)
    return token


class _QuietServer(uvicorn.Server):
    """Several servers share one process; the agent owns signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Agent:
    def __init__(
        self,
        state_dir: str | Path,
        *,
        config_path: str | None = None,
        fallback_path: str | None = None,
        subsystems: list[Subsystem] | None = None,
        listen_port: int | None = None,
        bind_retry_seconds: float = 1.0,
        retry_base_seconds: float = 1.0,
        early_sockets: dict[str, socket.socket] | None = None,
        early_release: Callable[[socket.socket], None] | None = None,
        agent_lock: AgentLock | None = None,
    ) -> None:
        self.state = StateDir(state_dir)
        # One agent per state directory (`trueup.journal.agentlock`): taken first
        # thing in run() unless the fast path took it already.
        self.agent_lock = agent_lock
        # Listeners the fast path bound before the API was imported
        # (trueup.agent.fastboot): taken over as they are, never bound anew;
        # `early_release` stops the early responder on one right before
        # uvicorn serves it.
        self._early_sockets = early_sockets if early_sockets is not None else {}
        self._early_release = early_release
        self.engine = Engine(self.state, subsystems)
        self.engine.api_port = listen_port
        self.orchestrator = Orchestrator(
            self.engine, config_path=config_path, fallback_path=fallback_path
        )
        self.listen_port = listen_port
        self.bind_retry_seconds = bind_retry_seconds
        self.started_at = now_iso()
        self.listeners: dict[str, ListenerRecord] = {}
        self.control_plane_version: int | None = None
        self.extra_status: AgentExtras = {}
        self._stop = threading.Event()
        self._servers: list[uvicorn.Server] = []
        self._server_by_name: dict[str, uvicorn.Server] = {}
        self._listener_changed = asyncio.Event()
        self.notifier = Notifier()
        self.status_interval = 5.0
        self.retry_base_seconds = retry_base_seconds
        self.loop: ReconcileLoop | None = None  # the reconcile loop, once phase 4 starts
        self.sync: Any = None  # the control-plane sync, when wired
        self.on_steady: list[Callable[[Agent], None]] = []
        self.on_stop: list[Callable[[], None]] = []
        # Set by trueup.agent.wiring; builds the loop in phase 4.
        self.loop_factory: Callable[[Agent], ReconcileLoop] | None = None
        self._metrics = AgentMetrics(
            lambda: self.status().to_json(),
            lambda: self.loop.view() if self.loop is not None else None,
        )

    # -- API surface --------------------------------------------------------
    def token_valid(self, token: str) -> bool:
        try:
            tokens = self.state.read(TOKENS_FILE, [])
            return token_matches([t["hash"] for t in tokens], token)
        except (StateFileError, OSError, TypeError, KeyError, AttributeError):
            return False  # a damaged token file refuses every token (listed as damaged)

    def management_health(self) -> ManagementHealth:
        """Management readiness from what is true now, never from how startup went.

        Ready when the management interface is up with every management
        address on it and the API serves. A phase-1 failure (a link that
        appeared late) does not latch it: whatever restored management — the
        startup retry, the loop, an apply — makes it ready; losing an address
        makes it not ready, with the reason.
        """
        phase = self.orchestrator.phases["management"]
        document = self._current_document() or self.orchestrator.management_document
        present: list[str] = []
        missing: list[str] = []
        link = "unknown"
        if document is not None:
            ifname = document.spec.management.interface
            try:
                with self.engine.sources() as sources:
                    links = {lk.name: lk for lk in sources.netlink.links()}
                    have = {a.prefix for a in sources.netlink.addresses() if a.ifname == ifname}
                info = links.get(ifname)
                link = "absent" if info is None else info.state
                present = [a for a in document.spec.management.addresses if a in have]
                missing = [a for a in document.spec.management.addresses if a not in have]
            except Exception as exc:  # reported, never raised to the probe
                missing = [f"(observe failed: {exc})"]
        # Any listener serving counts: with a read-only state directory the unix
        # socket cannot be created, and the management port serves the API alone.
        serving = any(entry.get("state") == "serving" for entry in self.listeners.values())
        ready = document is not None and serving and link == "up" and not missing
        reason: str | None = None
        if document is None:
            reason = "no management configuration (no accepted revision, config or fallback)"
        elif link != "up":
            reason = f"management interface {document.spec.management.interface} is {link}"
        elif missing:
            reason = "missing " + ", ".join(missing)
        elif not serving:
            reason = "the API is not serving yet"
        return {
            "ready": ready,
            "reason": reason,
            "phase": phase.state,
            "interface": document.spec.management.interface if document else None,
            "link": link,
            "addresses": present,
            "missing": missing,
            "listeners": self.listeners,
            "error": None if ready else self.orchestrator.management_error,
        }

    def _may_heal(self, name: str) -> bool:
        """Whether the reconcile loop lets `name` be healed now (policy, ack, breaker)."""
        if self.loop is None:
            return True
        entry = self.loop.status_inputs()["policies"].get(name)
        return entry is None or entry["healing"] == "active"

    def _current_document(self) -> DeviceState | None:
        try:
            return self.engine.applied_document()
        except Exception:  # an unreadable revision must not break the probe
            return None

    def services_health(self) -> ServicesHealth:
        out: dict[str, ServiceHealth] = {}
        status = self.status().to_json()
        for name, sub in status["subsystems"].items():
            out[name] = {
                "health": sub["health"],
                "reason": sub["reason"],
                "since": sub.get("since"),
                "tier": sub["tier"],
            }
        # Beside the services, never in front of management: which state files
        # are damaged and what that refuses.
        damaged = status["state_directory"]["damaged"]
        health = "ok"
        if damaged:
            health = "failed" if status["state_directory"]["writes_refused"] else "degraded"
        state_directory: StateDirectoryHealth = {
            "health": health,
            "reason": "; ".join(f"{d['path']}: {d['problem']}" for d in damaged),
            "damaged": damaged,
        }
        return {"subsystems": out, "state_directory": state_directory}

    def status(self) -> Status:
        """The status document (`/v1/status` serves its `to_json()`): built by
        `trueup.reconcile.status.build_status` from what the agent knows."""
        orchestrator = self.orchestrator
        return build_status(
            self.engine,
            control_plane_version=self.control_plane_version,
            loop=self.loop.view() if self.loop is not None else None,
            # Startup's verdicts (pending, failed at a deadline) show until the
            # subsystem is seen healthy again, by whichever pass healed it.
            startup_health=orchestrator.subsystem_health,
            forget_startup_verdict=orchestrator.clear_health,
            management=self.management_health(),
            agent=AgentInfo(
                pid=os.getpid(),
                started_at=self.started_at,
                state_dir=str(self.state.root),
                startup=orchestrator.phase_list(),
                startup_drift=orchestrator.startup_drift,
                extra=self.extra_status,
                config_error=orchestrator.config_error,
            ),
            control_plane=self.sync.status() if self.sync is not None else None,
        )

    def drift(self) -> dict[str, Any]:
        return drift_report(self.status().to_json())

    @property
    def requests(self) -> Requests:
        """Apply, rollback, plan, confirm, reconcile, ack: into the loop once it runs."""
        return Requests(self.engine, lambda: self.loop)

    def evidence(self) -> bytes:
        """The runbook's evidence bundle (`trueup.backup.evidence`), with the live status."""
        return collect_evidence(
            self.engine, status=self.status().to_json(), source=f"agent pid {os.getpid()} (live)"
        )

    def metrics(self) -> str:
        """`/metrics`: Prometheus text, from the status and the loop as they are now."""
        return self._metrics.render()

    # -- listeners ----------------------------------------------------------
    def _unix_socket(self) -> socket.socket:
        early = self._early_sockets.pop("unix", None)
        if early is not None:
            return early
        return bind_unix(self.state.socket_path)

    def _tcp_socket(self, address: str, port: int) -> socket.socket:
        early = self._early_sockets.pop(listener_key(address, port), None)
        if early is not None:
            return early
        return bind_tcp(address, port)

    async def _close_unclaimed_early(self, after: float = 5.0) -> None:
        """Early listeners this agent did not take (another port or bind address): closed."""
        await asyncio.sleep(after)
        for key in list(self._early_sockets):
            sock = self._early_sockets.pop(key)
            if self._early_release is not None:
                await asyncio.to_thread(self._early_release, sock)
            sock.close()

    async def _serve(self, name: str, sock: socket.socket, *, require_token: bool) -> None:
        app = create_app(self, require_token=require_token)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = _QuietServer(config)
        self._servers.append(server)
        self._server_by_name[name] = server
        self.listeners[name]["state"] = "serving"
        self.listeners[name]["since"] = now_iso()
        self._listener_changed.set()
        if self._early_release is not None:
            # Loaded before the early responder lets go, so what is left between
            # its last accept and uvicorn's first is the listener's creation.
            config.load()
            self._early_release(sock)  # the backlog is uvicorn's from here on
        try:
            await server.serve(sockets=[sock])
        finally:
            if self.listeners[name]["state"] == "serving":
                self.listeners[name]["state"] = "closed"
            sock.close()

    async def _listen(self, name: str, address: str, port: int) -> None:
        """Bind and serve, retrying a failed bind with back-off; never fatal."""
        self.listeners[name] = {"address": address, "port": port, "state": "binding"}
        attempts = 0
        delay = self.bind_retry_seconds
        while not self._stop.is_set():
            attempts += 1
            try:
                sock = self._tcp_socket(address, port)
            except OSError as exc:
                self.listeners[name].update(
                    {"state": "waiting", "error": exc.strerror or str(exc), "attempts": attempts}
                )
                if attempts == 1:
                    log.warning("cannot bind %s port %s yet (%s); retrying", address, port, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self.listeners[name].pop("error", None)
            self.listeners[name]["attempts"] = attempts
            await self._serve(name, sock, require_token=True)
            return

    async def _serve_tcp(self, document: DeviceState | None) -> None:
        """The management port: on the named address when it works, else the wildcard.

        A named bind address that is absent never stops the agent: the wildcard
        serves meanwhile and the named bind is retried. Once the named bind
        serves *and* its address is on an interface, the wildcard closes, so
        the API listens only where it was told. If the address disappears later
        (a socket bound to it keeps listening but receives nothing), the
        wildcard comes back within a second, and closes again when the address
        returns.
        """
        while document is None and self.listen_port is None and not self._stop.is_set():
            # Nothing accepted yet (a new router): the management port opens with
            # the first applied revision, whichever way it arrives.
            await asyncio.sleep(0.5)
            document = await asyncio.to_thread(self._current_document)
        if document is None and self.listen_port is None:
            return
        port = self.listen_port or (document.spec.management.api.port if document else 7443)
        named = document.spec.api_bind_address() if document else None
        if (
            named is not None
            and document is not None
            and is_virtual(named, virtual_addresses(document))
        ):
            # An HA virtual address is held only while the role holds it: never bound.
            log.warning("bind %s is an HA virtual address; serving on the wildcard", named)
            named = None
        if named is None:
            await self._listen("tcp", "::", port)
            return
        named_task = asyncio.create_task(self._listen("bind", named, port))
        await asyncio.sleep(0.05)
        fallback: asyncio.Task[None] | None = None
        while not self._stop.is_set():
            present = await asyncio.to_thread(self._address_present, named)
            named_ok = present and self.listeners["bind"].get("state") == "serving"
            self.listeners["bind"]["address_present"] = present
            if not named_ok and (fallback is None or fallback.done()):
                log.warning("named bind %s:%s not usable; serving on the wildcard", named, port)
                self.listeners["bind"]["fallback"] = "wildcard"
                fallback = asyncio.create_task(self._listen("tcp", "::", port))
            elif named_ok and fallback is not None and not fallback.done():
                server = self._server_by_name.get("tcp")
                if server is not None and self.listeners.get("tcp", {}).get("state") == "serving":
                    log.info("named bind %s:%s serving; closing the wildcard fallback", named, port)
                    self.listeners["tcp"]["state"] = "closed: named bind serving"
                    self.listeners["bind"]["fallback"] = None
                    server.should_exit = True
                    await fallback
                    fallback = None
            self._listener_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listener_changed.wait(), 0.5)
        if fallback is not None:
            await fallback
        await named_task

    def _address_present(self, address: str) -> bool:
        try:
            with self.engine.sources() as sources:
                return any(a.prefix.split("/")[0] == address for a in sources.netlink.addresses())
        except Exception:  # an observation failure must not take the listener down
            return True

    async def _notify_loop(self) -> None:
        """READY=1 once phase 1 is done; then STATUS= lines and watchdog pings."""
        self.notifier.send("READY=1", "STATUS=management ready; starting subsystems")
        interval = watchdog_interval()
        last_status = ""
        while not self._stop.is_set():
            if interval is not None:
                self.notifier.send("WATCHDOG=1")
            try:
                # pyroute2's sync API runs its own event loop: never on this one.
                text = await asyncio.to_thread(self._status_line)
            except Exception as exc:  # the status line must never stop the pings
                text = f"status unavailable: {exc}"
            if text != last_status:
                self.notifier.send(f"STATUS={text}")
                last_status = text
            await asyncio.sleep(interval if interval is not None else self.status_interval)

    def _status_line(self) -> str:
        health = self.management_health()
        head = "management ready" if health["ready"] else "management NOT ready"
        degraded = []
        for name, sub in self.services_health()["subsystems"].items():
            if sub["health"] != "ok":
                degraded.append(f"{name} {sub['health']}")
        return head + ("; " + ", ".join(degraded) if degraded else "; all subsystems ok")

    # -- run ----------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; 1 when another agent runs on the state directory.

        The agent lock comes first: a second agent touches nothing (not the
        socket, not the port, no state file) and the first keeps serving.
        """
        if self.agent_lock is None:
            try:
                self.agent_lock = take_agent_lock(self.state.root)
            except AgentRunning as exc:
                print(f"trueup agent run: {exc}", file=sys.stderr)
                return 1
        for note in self.agent_lock.notes:
            log.warning("agent lock: %s", note)
        orchestrator = self.orchestrator
        orchestrator.load()
        # Where phase 1 took the management facts from, and what it skipped (why).
        self.extra_status["management_source"] = orchestrator.management_from.to_json()
        orchestrator.management()
        return asyncio.run(self._main())

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self._listener_changed = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop)
        self.listeners["unix"] = {"path": str(self.state.socket_path), "state": "binding"}
        unix_task = asyncio.create_task(self._listen_unix())
        tcp_task = asyncio.create_task(self._serve_tcp(self.orchestrator.management_document))
        # Held so it is not collected; asyncio.run cancels it if the agent stops first.
        self._early_closer = asyncio.create_task(self._close_unclaimed_early())
        await asyncio.sleep(0.01)
        notify_task = asyncio.create_task(self._notify_loop())
        worker = threading.Thread(target=self._after_management, name="trueup-startup", daemon=True)
        worker.start()
        threading.Thread(target=_sweep_sockets, name="trueup-sweep", daemon=True).start()
        await asyncio.gather(unix_task, tcp_task, return_exceptions=True)
        notify_task.cancel()
        if isinstance(self.engine.daemons, DaemonSupervisor):
            # Daemons keep running; the socket directories of those that do not are removed.
            await asyncio.to_thread(self.engine.daemons.close)
        self.notifier.send("STOPPING=1")
        return 0

    async def _listen_unix(self) -> None:
        """The unix socket; when it cannot be created, retried while the management port serves.

        A read-only (or vanished) state directory must not stop the agent: the
        API stays on the management port, and the socket is reported (status,
        the damaged-state list) until it can be created.
        """
        path = self.state.socket_path
        delay = self.bind_retry_seconds
        while not self._stop.is_set():
            try:
                sock = self._unix_socket()
            except OSError as exc:
                problem = (
                    f"cannot create the agent socket: {exc.strerror or exc}; the management "
                    "port serves the API meanwhile"
                )
                if self.listeners["unix"].get("state") != "failed":
                    log.error("%s: %s", path, problem)
                self.listeners["unix"].update({"state": "failed", "error": problem})
                self.engine.check.note(path, problem)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self.listeners["unix"].pop("error", None)
            self.engine.check.forget(path)
            await self._serve("unix", sock, require_token=False)
            return

    def _request_stop(self) -> None:
        self._stop.set()
        for callback in self.on_stop:
            threading.Thread(target=callback, daemon=True).start()
        if self.loop is not None:
            self.loop.stop()
        for server in self._servers:
            server.should_exit = True

    def _after_management(self) -> None:
        orchestrator = self.orchestrator
        # The audit chain and every revision, once, off the management path.
        self._step("checking the state directory", lambda: self.engine.check.damaged(deep=True))
        self._step("recovery", orchestrator.recovery)
        self._step("a pending restore", lambda: restore_resume(self))
        self._step("the subsystem phase", orchestrator.subsystems)
        orchestrator.steady()
        if not self._step("starting the reconcile loop", self.start_loop):
            phase = orchestrator.phases["steady"]
            phase.state, phase.detail = "failed", "the reconcile loop did not start (see the log)"
        for start in self.on_steady:
            try:
                start(self)
            except Exception:  # an optional part must never take the agent down
                log.exception("starting %s failed", start)
        orchestrator.retry_failed(self._stop, base=self.retry_base_seconds, may_heal=self._may_heal)

    def _step(self, what: str, step: Callable[[], object]) -> bool:
        """Run one startup step; a failure is logged and reported, never the end of startup."""
        try:
            step()
        except Exception:
            log.exception("%s failed", what)
            return False
        return True

    def start_loop(self) -> None:
        """Phase 4; the reconcile loop when it is wired in."""
        if self.loop_factory is not None:
            self.loop = loop = self.loop_factory(self)
            # What the start left pending (a late link) or failed is finished by the
            # loop under every policy; `notify` governs only later changes.
            loop.finish_start(self.orchestrator.unsettled())
            loop.start()

    def stop(self) -> None:
        self._request_stop()
