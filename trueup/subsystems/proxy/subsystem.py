"""Reverse proxies (`spec.proxies`): HAProxy frontends and backends, run by the agent.

What trueup owns: the HAProxy master it starts in the router's namespace
(`Sources.daemons`, run directory `STATE_DIR/run/haproxy`, 0700, files 0600;
the packaged `haproxy` service is never used) and its configuration file.

Facts:

| path | desired | observed |
|---|---|---|
| `spec.proxies.running` | true (absent: no proxies) | the supervisor's verified master pid |
| `spec.proxies.config` | the canonical section | the section trueup wrote, when the file still hashes to what trueup wrote; `edited outside trueup (sha256:…)` otherwise |
| `spec.proxies.loaded` | true | whether the master's last successful (re)load read the file as it is |
| `spec.proxies[NAME].bound` | true | the frontend is OPEN in `show stat` |

Steps: `write-config` (render, `haproxy -c` on a candidate, rename: a
configuration HAProxy refuses changes nothing), `reload` (start the master,
or SIGUSR2 to it: a seamless reload, listeners handed to the new worker),
`stop`. A frontend whose bind address is not on the router is left out of
the file so the others are served; while its address is absent it counts as
waiting (its `bound` fact holds, as DHCP's interfaces that are not there yet
do), `condition()` reports the subsystem `pending` with a reason naming the
address, and the address watch (`rtnetlink("address")`) brings it in when the
address appears: `bound` then differs, and the heal writes and reloads.

Why this module is over 400 lines: the facts, the steps and the reload's
waits share one reading of the run record (the section written, the frontends
left out, the digests written and loaded) and of the master's answers; split,
each would re-derive it.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier
from trueup.subsystems.base import (
    Facts,
    Plan,
    Scope,
    Sources,
    Step,
    StepError,
    Subsystem,
)
from trueup.subsystems.daemonkit import (
    RunRecord,
    check,
    ensure_or_reload,
    failed_daemon,
    read_text,
    remove_file,
    step_failures,
)
from trueup.subsystems.proxy.section import SECTION, ProxySection, split_endpoint
from trueup.system.daemonspec import DaemonSpec
from trueup.system.haproxy import (
    DAEMON,
    HaproxyError,
    HaproxyPaths,
    ProxyConfig,
    check_argv,
    check_problem,
    digest_text,
    haproxy_paths,
    parse_proc,
    parse_stat,
    query,
    render_config,
)
from trueup.system.haproxy import REQUIREMENTS as HAPROXY_REQUIREMENTS
from trueup.system.requirements import Requirement
from trueup.system.sockets import make_socket_dir
from trueup.system.sources import Files, HostFiles
from trueup.system.watches import STATE_DIR, every, files, rtnetlink

__all__ = ["ProxySection", "ProxySubsystem"]

RUNNING, CONFIG, LOADED = "spec.proxies.running", "spec.proxies.config", "spec.proxies.loaded"
_READY_TIMEOUT = 15.0
# Status never waits long for a HAProxy that does not answer.
_REPORT_TIMEOUT = 1.0


def _bound(name: str) -> str:
    return f"spec.proxies[{name}].bound"


class ProxyState(TypedDict, total=False):
    """The run record (`run/haproxy/trueup-proxy.json`): what trueup last wrote."""

    # The canonical section the file was rendered from (`ProxySection.canonical()`).
    section: list[ProxyConfig]
    # Frontends left out of the file while their bind address is absent.
    omitted: list[str]
    # The digest of the file trueup wrote, and of the file the master last loaded.
    digest: str
    loaded: str


class _FrontendRequired(TypedDict):
    bind: str
    bound: bool


class FrontendReport(_FrontendRequired, total=False):
    """One frontend in status: its bind endpoint, whether it is open, and its servers."""

    # Why it is left out of the file (its bind address is absent).
    reason: str
    # Server → its status in `show stat`, when HAProxy answers.
    servers: dict[str, str]


class ProxyReport(TypedDict, total=False):
    """What status shows beside the facts (empty: no proxies and no HAProxy)."""

    running: bool
    frontends: dict[str, FrontendReport]
    # The master's version and reload count; `master`: why it does not answer.
    version: str | None
    reloads: int
    master: str
    # Why the stats socket does not answer.
    stats: str


def _record(paths: HaproxyPaths) -> RunRecord[ProxyState]:
    return RunRecord(paths.state)


class ProxySubsystem(Subsystem):
    name = "proxy"
    tier = Tier.OPTIONAL
    # Bind addresses are on managed interfaces; a proxy never waits on services.
    depends_on = ("addresses",)
    section = SECTION
    # The file edited by hand (inotify), a bind address appearing (rtnetlink), and a
    # periodic look for what sends no event (HAProxy's own state).
    watches = (
        files(f"{STATE_DIR}/run/{DAEMON}/haproxy.cfg"),
        rtnetlink("address"),
        every(5.0),
    )

    def __init__(self, files: Files | None = None) -> None:
        # Where the certificates are read (`prepare`): the machine's files, or a test's fake.
        self.files: Files = files if files is not None else HostFiles()
        # Section digest → section, for the plans this process made (steps name the digest).
        self._sections: dict[str, list[ProxyConfig]] = {}

    def requirements(self, document: DeviceState) -> list[Requirement]:
        section = document.spec.section("proxies", ProxySection)
        return list(HAPROXY_REQUIREMENTS) if section is not None and section.root else []

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("proxies", ProxySection) is not None

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("proxies", ProxySection)
        if section is None or not section.root:
            return {RUNNING: None, CONFIG: None}
        facts: Facts = {RUNNING: True, CONFIG: section.canonical(), LOADED: True}
        for proxy in section.root:
            facts[_bound(proxy.name)] = True
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        paths = haproxy_paths(sources.daemons.run_dir(DAEMON))
        state = _record(paths).read(sources.files)
        facts: Facts = {CONFIG: _observed_config(sources.files, paths, state)}
        if not sources.daemons.running(DAEMON):
            facts[RUNNING] = None
            return facts
        facts[RUNNING] = True
        loaded = _file_digest(sources.files, paths)
        facts[LOADED] = loaded is not None and state.get("loaded") == loaded
        section = state.get("section") or []
        present = _present(sources) | {"*"}
        omitted = set(state.get("omitted") or [])
        for proxy in section:
            if proxy["name"] in omitted and split_endpoint(proxy["bind"])[0] not in present:
                # Left out while its address is absent, as asked: it waits, and
                # `condition()` reports the subsystem pending with the address.
                facts[_bound(proxy["name"])] = True
        try:
            stats = parse_stat(query(paths.stats, "show stat"))
        except HaproxyError:
            return facts  # not answering (yet): the other frontends count as unbound
        for proxy in section:
            facts.setdefault(_bound(proxy["name"]), stats.frontends.get(proxy["name"]) == "OPEN")
        for name, status in stats.frontends.items():
            facts.setdefault(_bound(name), status == "OPEN")
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        if desired.get(RUNNING) is None:
            steps = []
            if observed.get(RUNNING) or observed.get(CONFIG) is not None:
                steps.append(Step(self.name, "stop", RUNNING))
            return Plan(self.name, steps, [] if steps else ["no proxies are asked for"])
        differing = sorted(k for k, v in desired.items() if k != RUNNING and observed.get(k) != v)
        if observed.get(RUNNING) and not differing:
            return Plan(self.name, [], ["HAProxy serves the document's proxies"])
        start = not observed.get(RUNNING)
        section = list(desired[CONFIG])
        digest = digest_text(json.dumps(section, sort_keys=True))
        self._sections[digest] = section
        names = ", ".join(p["name"] for p in section)
        return Plan(
            self.name,
            [
                Step(self.name, "write-config", CONFIG, {"frontends": names, "section": digest}),
                Step(self.name, "reload", LOADED if not start else RUNNING, {"start": start}),
            ],
        )

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        paths = haproxy_paths(sources.daemons.run_dir(DAEMON))
        with step_failures(step, HaproxyError):
            if step.action == "stop":
                sources.daemons.stop(DAEMON)
                remove_file(sources.files, paths.config)
                remove_file(sources.files, paths.state)
            elif step.action == "write-config":
                section = self._sections.get(step.args["section"])
                if section is None:
                    raise StepError(step, "no plan of this process names that section")
                _write_config(sources, step, paths, section)
            elif step.action == "reload":
                _reload(sources, step, paths)
            else:
                raise ValueError(f"unknown proxy step {step.action}")

    def prepare(self, document: DeviceState) -> None:
        section = document.spec.section("proxies", ProxySection)
        for index, proxy in enumerate(section.root if section else []):
            if proxy.tls is not None:
                certificate = proxy.tls.certificate
                try:
                    if self.files.read(certificate) is None:
                        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
                except UnicodeDecodeError:
                    pass  # readable; HAProxy's own check judges what it holds
                except OSError as exc:
                    raise ValueError(
                        f"spec.proxies[{index}].tls.certificate: cannot read "
                        f"{certificate}: {exc.strerror}"
                    ) from exc

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        section = document.spec.section("proxies", ProxySection)
        if section is None:
            return None
        missing = _missing(sources, [(p.name, p.bind) for p in section.root])
        if missing:
            return SubsystemHealth.PENDING, _missing_reason(missing)
        return failed_daemon(sources, DAEMON)

    def report(self, sources: Sources, scope: Scope) -> ProxyReport:
        paths = haproxy_paths(sources.daemons.run_dir(DAEMON))
        state = _record(paths).read(sources.files)
        section = state.get("section") or []
        if not section and not sources.daemons.running(DAEMON):
            return {}
        frontends: dict[str, FrontendReport] = {}
        out: ProxyReport = {"running": sources.daemons.running(DAEMON), "frontends": frontends}
        try:
            master = parse_proc(query(paths.master, "show proc", _REPORT_TIMEOUT))
            out["version"], out["reloads"] = master.version, master.reloads
        except HaproxyError as exc:
            out["version"], out["master"] = None, str(exc)
        try:
            stats = parse_stat(query(paths.stats, "show stat", _REPORT_TIMEOUT))
        except HaproxyError as exc:
            stats = None
            out["stats"] = str(exc)
        omitted = set(state.get("omitted", []))
        for proxy in section:
            name = proxy["name"]
            status = stats.frontends.get(name) if stats else None
            entry: FrontendReport = {"bind": proxy["bind"], "bound": status == "OPEN"}
            if name in omitted:
                entry["reason"] = f"bind address {split_endpoint(proxy['bind'])[0]} is absent"
            if stats is not None:
                entry["servers"] = stats.servers.get(name, {})
            frontends[name] = entry
        return out


# -- helpers ----------------------------------------------------------------------
def _missing(sources: Sources, binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    present = _present(sources)
    return [(n, b) for n, b in binds if split_endpoint(b)[0] not in present | {"*"}]


def _missing_reason(missing: list[tuple[str, str]]) -> str:
    parts = [f"{name} ({split_endpoint(bind)[0]})" for name, bind in missing]
    return (
        f"waiting for bind address(es): frontend(s) {', '.join(parts)} not on this router; "
        "the other frontends are served"
    )


def _present(sources: Sources) -> set[str]:
    return {a.prefix.split("/")[0] for a in sources.netlink.addresses()}


def _write_config(
    sources: Sources, step: Step, paths: HaproxyPaths, proxies: list[ProxyConfig]
) -> None:
    text, omitted = render_config(paths, proxies, _present(sources))
    done = check(sources, paths.candidate, text, check_argv(paths.candidate), keep=True)
    problem = check_problem(done)
    if problem is not None:
        raise StepError(step, f"HAProxy refuses the configuration (nothing changed): {problem}")

    def written(state: ProxyState) -> None:
        state["section"] = proxies
        state["omitted"] = omitted
        state["digest"] = digest_text(text)

    # The state first: a crash between the two leaves a file trueup can still name.
    _record(paths).update(sources.files, written)
    sources.files.replace_private(paths.candidate, paths.config)


def _reload(sources: Sources, step: Step, paths: HaproxyPaths) -> None:
    digest = _file_digest(sources.files, paths)
    if digest is None:
        raise StepError(step, f"{paths.config} is missing")
    # Started means the master answers on its CLI: one that exits at once (a port
    # another process holds) fails the step with HAProxy's own last lines.
    spec = DaemonSpec(
        DAEMON,
        paths.argv,
        stop_timeout=35.0,
        reexec=True,
        # Every (re)start: the sockets' directory when they are moved out of run/.
        before_start=lambda: make_socket_dir(paths.master.parent, paths.run_dir),
        ready=lambda pid: _answers(paths.master, "show proc"),
        sockets=paths.master.parent,
    )
    seen: list[tuple[int, int]] = []  # the master's reloads and failures before the reload

    def before_reload() -> None:
        before = parse_proc(wait_for(paths.master, "show proc", _READY_TIMEOUT))
        seen.append((before.reloads, before.failed))

    # SIGUSR2 to a running master: a seamless reload, listeners handed to the new worker.
    started = ensure_or_reload(
        sources,
        spec,
        signal.SIGUSR2,
        before_reload=before_reload,
        gone="HAProxy stopped before it could be reloaded",
    )
    if started:
        try:
            wait_for(paths.master, "show proc", _READY_TIMEOUT)
        except HaproxyError as exc:
            alerts = _alerts(sources.files, paths)
            raise StepError(step, f"HAProxy did not start: {alerts or exc}") from exc
    else:
        _wait_reloaded(step, paths, *seen[-1])
    _wait_serving(step, paths)

    def loaded(state: ProxyState) -> None:
        state["loaded"] = digest

    _record(paths).update(sources.files, loaded)


def _wait_reloaded(step: Step, paths: HaproxyPaths, reloads: int, failed: int) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            now = parse_proc(query(paths.master, "show proc"))
        except HaproxyError:
            time.sleep(0.02)  # the master re-executes itself
            continue
        if now.failed > failed:
            raise StepError(step, "HAProxy's reload failed; the previous worker still serves")
        if now.reloads > reloads and now.workers:
            return
        time.sleep(0.02)
    raise StepError(step, f"HAProxy did not finish reloading in {_READY_TIMEOUT:g}s")


def _wait_serving(step: Step, paths: HaproxyPaths) -> None:
    """Until the new worker answers on the stats socket (its listeners are then open)."""
    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        try:
            parse_stat(query(paths.stats, "show stat"))
            return
        except HaproxyError as exc:
            if time.monotonic() > deadline:
                raise StepError(step, f"HAProxy's worker does not answer: {exc}") from exc
            time.sleep(0.02)


def _answers(path: Path, command: str) -> bool:
    try:
        query(path, command, _REPORT_TIMEOUT)
    except HaproxyError:
        return False
    return True


def wait_for(path: Path, command: str, timeout: float) -> str:
    """`query` until it answers (a master re-executing itself does not, for a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return query(path, command)
        except HaproxyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _alerts(files: Files, paths: HaproxyPaths) -> str:
    """HAProxy's last alerts in its log (why it did not start: a port already taken, …)."""
    try:
        log_file = paths.run_dir / f"{DAEMON}.log"
        lines = files.read_private(log_file).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "; ".join(line.split(" : ", 1)[-1] for line in lines[-50:] if "ALERT" in line)[-600:]


def _file_digest(files: Files, paths: HaproxyPaths) -> str | None:
    text = read_text(files, paths.config)  # None: rewritten, or the write names what is there
    return digest_text(text) if text is not None else None


def _observed_config(files: Files, paths: HaproxyPaths, state: ProxyState) -> Any:
    digest = _file_digest(files, paths)
    if digest is None:
        return None
    if digest != state.get("digest"):
        return f"edited outside trueup ({digest})"
    return state.get("section")
