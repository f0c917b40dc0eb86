"""Dynamic routing (`spec.routing`): BGP, OSPFv2 and OSPFv3, run by FRR in the router's namespace.

What trueup owns: the FRR daemons it starts (zebra, and bgpd, ospfd, ospf6d,
bfdd as the section needs them; `Sources.daemons`, the packaged `frr`
service is never used) and their whole configuration. What it never owns:
the routes FRR installs (proto bgp, ospf, zebra: the routes subsystem leaves
them alone) and the sessions' states, which are status, not facts.

Facts:

| path | desired | observed |
|---|---|---|
| `spec.routing.daemons` | the daemons the section needs | the supervisor's verified daemons |
| `spec.routing.config` | `frr.conf`'s lines (`render`) | the lines trueup applied while `show running-config` is what it was after that apply; else the running configuration itself, normalised |

So a `vtysh` edit is drift (the running configuration no longer matches),
and a before-image is a configuration FRR can take back. Passwords are never
in a fact: `password secret:NAME` stands for the stored secret.

Steps: `start` (the daemons the section needs, zebra first; the others
stopped), `reload` (FRR's check of the candidate — `vtysh -C`, then bgpd's
`-C` — and, accepted, `frr-reload.py`, which changes only the lines that
differ, so unchanged neighbours keep their sessions), `stop`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier
from trueup.subsystems.base import (
    Difference,
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
    failed_daemon,
    remove_file,
    step_failures,
    write_file,
)
from trueup.subsystems.routing.observe import routing_report
from trueup.subsystems.routing.render import (
    HEADER,
    ROOT,
    bgp_part,
    daemons_for,
    render,
    with_secrets,
)
from trueup.subsystems.routing.section import SECTION, RoutingSection
from trueup.system.daemonspec import DaemonSpec
from trueup.system.frr import (
    ALL_DAEMONS,
    REQUIREMENTS,
    FrrControl,
    FrrError,
    FrrPaths,
    Refusal,
    answers,
    daemon_name,
    frr_paths,
)
from trueup.system.requirements import Requirement
from trueup.system.secretstore import SecretError, read_secret
from trueup.system.sockets import make_socket_dir
from trueup.system.watches import every

__all__ = ["RoutingSubsystem"]

DAEMONS, CONFIG, SOURCES = "spec.routing.daemons", "spec.routing.config", "spec.routing.sources"
_READY_TIMEOUT = 30.0
_BGP_PASSWORD = re.compile(r"^[!-~]{1,80}\Z")
# A look at the running configuration answers in well under a second; a daemon silent
# this long is hung, and the look ends instead of holding its caller for a minute.
_LOOK_TIMEOUT = 10.0
MAIN = 254


class RoutingState(TypedDict, total=False):
    """The run record (`run/frr/state.json`): what trueup last applied."""

    # The configuration's lines as trueup rendered them (secret references, not values).
    lines: list[str]
    # The digest of the normalised running configuration right after that apply.
    running: str
    # Neighbour address → the secret its password is.
    passwords: dict[str, str]


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _paths(sources: Sources) -> FrrPaths:
    return frr_paths(sources.daemons.run_dir("frr"))


def _record(paths: FrrPaths) -> RunRecord[RoutingState]:
    return RunRecord(paths.state)


def _secret(sources: Sources, step: Step, name: str, path: str = ROOT) -> str:
    try:
        value = read_secret(sources.state_dir, name)
    except SecretError as exc:
        raise StepError(step, f"{path}: {exc}") from exc
    if value is None:
        raise StepError(
            step,
            f"{path}: secret {name!r} is not on this device: store it with "
            f"`trueup secret set {name}` or add it to the device's secrets in the control plane",
        )
    if not _BGP_PASSWORD.match(value):
        # Never written into frr.conf: a line break would end the line and start another.
        raise StepError(
            step,
            f"{path}: secret {name!r} is not a BGP password: 1-80 printable ASCII characters "
            "without spaces or line breaks (FRR's TCP MD5 key); store another value with "
            f"`trueup secret set {name}`",
        )
    return value


def _passwords(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        words = line.split()
        if len(words) == 4 and words[0] == "neighbor" and words[2] == "password":
            out[words[1]] = words[3].removeprefix("secret:")
    return out


def _password_path(lines: list[str], origins: list[str], name: str) -> str:
    """The document path of the first neighbour whose password is secret `name`."""
    for line, origin in zip(lines, origins, strict=False):
        if line.endswith(f" password secret:{name}"):
            return origin
    return ROOT


def _password_ref(sources: Sources, record: RoutingState) -> Callable[[str, str], str]:
    """How observation names a running password: `secret:NAME` when it is the value of the
    secret trueup applied for that neighbour, else nothing (its digest stands in)."""
    names = record.get("passwords", {})

    def ref(address: str, value: str) -> str:
        name = names.get(address)
        if name is None:
            return ""
        try:
            stored = read_secret(sources.state_dir, name)
        except SecretError:
            return ""
        return f"secret:{name}" if stored is not None and stored == value else ""

    return ref


def _answering(vty: Path) -> Callable[[int], bool]:
    """Started means answering: the daemon accepts connections on its vty socket."""
    return lambda _pid: answers(vty)


def _masked(words: str, secrets: Mapping[str, str]) -> str:
    """FRR's words with every secret's value replaced by its name (FRR may echo a line)."""
    for name, value in secrets.items():
        words = words.replace(value, f"secret:{name}")
    return words


def _refused(
    lines: list[str], origins: list[str], refusal: Refusal, secrets: Mapping[str, str]
) -> str:
    """One refusal at the document path of its line, in FRR's words (secrets named, not shown)."""
    if refusal.in_bgp_part:
        numbered = bgp_part(lines, origins)
        text, origin = (numbered.lines, numbered.paths)
    else:
        text, origin = lines, origins
    index = refusal.line - 1
    path = origin[index] if 0 <= index < len(origin) else ROOT
    line = f" (`{text[index].strip()}`)" if 0 <= index < len(text) else ""
    return f"{path}{line}: {_masked(refusal.words, secrets)}"


class RoutingSubsystem(Subsystem):
    name = "routing"
    tier = Tier.ROUTING
    # OSPF runs on managed interfaces, BGP sessions over their addresses.
    depends_on = ("addresses",)
    section = SECTION
    # vtysh edits and session changes send no event trueup can name: look every 5 s.
    watches = (every(5.0),)

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        """zebra (every other daemon needs it) not running: failed, in its own words."""
        return failed_daemon(sources, daemon_name("zebra")) if self.configured(document) else None

    def requirements(self, document: DeviceState) -> list[Requirement]:
        del document
        return list(REQUIREMENTS)

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("routing", RoutingSection) is not None

    def diff(self, desired: Facts, observed: Facts) -> list[Difference]:
        # Where each line comes from is for FRR's refusals, not a fact of the system.
        return super().diff({k: v for k, v in desired.items() if k != SOURCES}, observed)

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("routing", RoutingSection)
        if section is None:
            return {DAEMONS: None, CONFIG: None}
        static = [r.to for r in document.spec.routes if document.spec.table_number(r.table) == MAIN]
        rendered = render(section, static)
        return {DAEMONS: daemons_for(section), CONFIG: rendered.lines, SOURCES: rendered.paths}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        running = [d for d in ALL_DAEMONS if sources.daemons.running(daemon_name(d))]
        if not running:
            return {DAEMONS: None, CONFIG: None}
        paths = _paths(sources)
        record = _record(paths).read(sources.files)
        facts: Facts = {DAEMONS: running}
        try:
            frr = FrrControl(sources.runner, paths, timeout=_LOOK_TIMEOUT)
            live = frr.running(_password_ref(sources, record))
        except FrrError:
            return {**facts, CONFIG: None}  # not answering: a reload is planned
        applied = record.get("lines")
        facts[CONFIG] = applied if applied and record.get("running") == _digest(live) else live
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        wanted, have = desired.get(DAEMONS), observed.get(DAEMONS)
        steps: list[Step] = []
        if wanted is None:
            if have:
                steps.append(Step(self.name, "stop", DAEMONS, {"daemons": list(have)}))
            return Plan(self.name, steps, [] if steps else ["no dynamic routing is asked for"])
        started = sorted(wanted) != sorted(have or [])
        config = desired.get(CONFIG)
        if started:
            # The passwords' secrets are checked before a daemon starts: one missing starts none.
            lines, origins = list(config or []), list(desired.get(SOURCES) or [])
            secrets = [
                [name, _password_path(lines, origins, name)]
                for name in sorted(set(_passwords(lines).values()))
            ]
            steps.append(
                Step(self.name, "start", DAEMONS, {"daemons": list(wanted), "_secrets": secrets})
            )
        if config is not None and (started or config != observed.get(CONFIG)):
            args = {
                "lines": len(config),
                "_config": list(config),
                "_sources": list(desired.get(SOURCES) or []),
            }
            steps.append(Step(self.name, "reload", CONFIG, args))
        return Plan(self.name, steps, [] if steps else ["FRR runs the document's configuration"])

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        paths = _paths(sources)
        with step_failures(step, FrrError):
            if step.action == "stop":
                for daemon in reversed(ALL_DAEMONS):
                    sources.daemons.stop(daemon_name(daemon))
                _record(paths).write(sources.files, {})
            elif step.action == "start":
                for name, path in step.args.get("_secrets", []):
                    _secret(sources, step, name, path)
                self._start(sources, paths, list(step.args["daemons"]))
            elif step.action == "reload":
                config, origins = list(step.args["_config"]), list(step.args["_sources"])
                self._reload(sources, paths, step, config, origins)
            else:
                raise ValueError(f"unknown routing step {step.action}")

    def _start(self, sources: Sources, paths: FrrPaths, daemons: list[str]) -> None:
        files = sources.files
        files.make_private_dir(paths.run_dir)
        write_file(files, paths.vtysh_conf, "service integrated-vtysh-config\n")
        write_file(
            files, paths.empty, "! FRR starts empty: trueup applies frr.conf once it answers\n"
        )
        make_socket_dir(paths.sockets, paths.run_dir)
        moved = paths.sockets if paths.sockets != paths.run_dir else None
        for daemon in ALL_DAEMONS:
            if daemon not in daemons:
                sources.daemons.stop(daemon_name(daemon))
        for daemon in ALL_DAEMONS:
            if daemon not in daemons:
                continue
            name = daemon_name(daemon)
            spec = DaemonSpec(
                name,
                paths.argv(daemon, sources.daemons.run_dir(name)),
                ready=_answering(paths.vty(daemon)),
                ready_timeout=_READY_TIMEOUT,
                sockets=moved,
            )
            sources.daemons.ensure(spec)

    def _reload(
        self, sources: Sources, paths: FrrPaths, step: Step, lines: list[str], origins: list[str]
    ) -> None:
        files = sources.files
        frr = FrrControl(sources.runner, paths)
        unknown = [line.split()[1] for line in lines if " password <sha256:" in line]
        if unknown:
            raise StepError(
                step,
                f"{ROOT}: the password of neighbour {unknown[0]} was not a stored secret; "
                "trueup cannot put it back (give it as a secret reference)",
            )
        secrets = {
            name: _secret(sources, step, name, _password_path(lines, origins, name))
            for name in sorted(set(_passwords(lines).values()))
        }
        real = with_secrets(lines, secrets.__getitem__)
        part = paths.run_dir / "frr-bgpd.conf.new"
        has_bgp = any(line.startswith("router bgp ") for line in lines)
        write_file(files, paths.candidate, "\n".join(real) + "\n")
        if has_bgp:
            write_file(
                files,
                part,
                "\n".join(with_secrets(bgp_part(lines, origins).lines, secrets.__getitem__)) + "\n",
            )
        try:
            refusals = frr.check(paths.candidate, part if has_bgp else None)
        finally:
            remove_file(files, paths.candidate)
            remove_file(files, part)
        if refusals:
            said = [_refused(lines, origins, refusal, secrets) for refusal in refusals]
            raise StepError(
                step, "FRR refused the configuration, nothing was changed: " + "; ".join(said)
            )
        applied = lines[: len(HEADER)] + frr.system_lines(files.read) + lines[len(HEADER) :]
        write_file(
            files, paths.config, "\n".join(with_secrets(applied, secrets.__getitem__)) + "\n"
        )
        try:
            frr.reload(paths.config)
        except FrrError as exc:
            raise FrrError(_masked(str(exc), secrets)) from None
        state: RoutingState = {"lines": lines, "passwords": _passwords(lines)}
        live = frr.running(_password_ref(sources, state))
        _record(paths).write(files, {**state, "running": _digest(live)})

    def report(self, sources: Sources, scope: Scope) -> Mapping[str, object]:
        return routing_report(sources, _paths(sources))
