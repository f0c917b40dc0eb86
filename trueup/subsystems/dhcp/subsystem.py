"""DHCP (`spec.dhcp`): Kea DHCPv4/DHCPv6, run and supervised by the agent, with the allocator fence.

What trueup owns: the Kea processes it starts in the router's namespace
(`Sources.daemons`, run directory `STATE_DIR/run/kea-dhcpN`, 0700), their
configuration (compiled from `spec.dhcp` by `keaconfig`), and whether they
allocate (the `dhcp` fence). What it never owns: the leases. Kea's memfile
is read, never written, truncated or replaced (docs/dhcp.md).

Facts, per family N used by the document:

| path | desired | observed |
|---|---|---|
| `spec.dhcp.dhcpN.running` | true (absent: not configured) | the supervisor's verified pid |
| `spec.dhcp.dhcpN.config` | digest of the compiled config | `config-get`, mapped through what trueup set |
| `spec.dhcp.dhcpN.file` | the same digest | the config file Kea starts from |
| `spec.dhcp.dhcpN.interfaces` | the document's interfaces | Kea's, plus those not present yet (they wait) |
| `spec.dhcp.dhcpN.ha` | whether the document has `ha:` | any HA hook/parameters in Kea's config |
| `spec.dhcp.dhcpN.allocation` | `follows-fence` | `follows-fence` or what disagrees |
| `spec.dhcp.dhcpN.changes` | (none) | for a foreign configuration: what differs in it (`changes`) |

A configuration set by someone else through the socket (or written to the
file) hashes to a digest trueup never set: `foreign:sha256:…` — drift.
Digests leave out the fence class (`keaconfig.unfenced`): whether Kea carries
it is the `allocation` fact, so holding or lifting the fence is not a change
of configuration.

Steps: `start` (write the config, with the fence class while the fence is
held, start Kea, re-assert the fence), `configure` (`config-test`,
`config-set`, `config-write`, fenced as the record says; on failure the
previous configuration is set back, fenced as the record says), `allocator`
(the fence class and dhcp-disable / dhcp-enable), `stop`.

Why this module is over 400 lines: the four facts, the four steps and the
supervisor's daemon specification share one reading of the fence record and
of Kea's running configuration; split apart, each half would re-derive it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier, waiting_on_links
from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import (
    Difference,
    Facts,
    FenceFollowed,
    Plan,
    Scope,
    Sources,
    Step,
    StepError,
    Subsystem,
    daemon_failure,
)
from trueup.subsystems.daemonkit import RunRecord, read_json, read_text, write_file
from trueup.subsystems.dhcp.allocator import (
    CONSISTENT,
    allocation_state,
    enforce,
    follow_fence,
    wait_for_socket,
)
from trueup.subsystems.dhcp.changes import ConfigChange, config_changes
from trueup.subsystems.dhcp.keaconfig import (
    compile_config,
    digest,
    has_ha,
    unfenced,
    with_fence,
)
from trueup.subsystems.dhcp.section import SECTION, DhcpSection
from trueup.system.daemonspec import DaemonError, DaemonSpec
from trueup.system.fence import read_fence
from trueup.system.kea import (
    KeaError,
    KeaPaths,
    clear_stale_pidfile,
    daemon_name,
    kea_call,
    kea_paths,
    make_socket_dir,
)
from trueup.system.kea import answers as kea_answers
from trueup.system.kea import requirements as kea_requirements
from trueup.system.requirements import Requirement
from trueup.system.sources import Files
from trueup.system.watches import every, rtnetlink

__all__ = ["DhcpSection", "DhcpSubsystem"]

FAMILIES = (4, 6)
# Digests are computed with these paths, so that they depend on the document alone.
_CANONICAL_RUN = Path("/STATE_DIR/run")
_KEEP = 16


def _canonical_paths(family: int) -> KeaPaths:
    run = _CANONICAL_RUN / daemon_name(family)
    return KeaPaths(
        family,
        run,
        run / f"kea-dhcp{family}.conf",
        run / f"kea{family}.sock",
        run / f"kea-leases{family}.csv",
        run / "allocator.json",
    )


class KeaDigest(TypedDict):
    """What trueup set for one Kea digest: the document's digest and its interfaces."""

    desired: str
    # The interfaces present when it was set, and those the section declares.
    interfaces: list[str]
    declared: list[str]


class KeaDigests(TypedDict, total=False):
    """The run record `applied.json`: which Kea digests are trueup's, newest last.

    `kea`: digests of what `config-get` answered; `file`: of the file Kea starts
    from. A cache (lost, the next observation shows a foreign digest and the next
    pass sets the configuration again): written without fsync, in insertion order
    (the oldest entries are dropped first).
    """

    kea: dict[str, KeaDigest]
    file: dict[str, KeaDigest]


class Reference(TypedDict, total=False):
    """The run record `reference.json`: what Kea answered for trueup's configuration
    (a foreign configuration is compared with it)."""

    desired: str
    body: JSONObject


def _digests_record(paths: KeaPaths) -> RunRecord[KeaDigests]:
    return RunRecord(paths.run_dir / "applied.json", sort_keys=False, durable=False)


def _reference_record(paths: KeaPaths) -> RunRecord[Reference]:
    return RunRecord(paths.run_dir / "reference.json", sort_keys=False, durable=False)


def _stored_section(paths: KeaPaths, wanted: str) -> Path:
    """Where the section a digest names is kept (for a rollback after an agent restart)."""
    return paths.run_dir / "sections" / f"{wanted.split(':')[-1]}.json"


def _path(family: int, what: str) -> str:
    return f"spec.dhcp.dhcp{family}.{what}"


def _body(config: JSONObject, family: int) -> Any:
    return config.get(f"Dhcp{family}") if isinstance(config, dict) else None


class DhcpSubsystem(Subsystem):
    name = "dhcp"
    tier = Tier.SERVICES
    depends_on = ("addresses",)
    section = SECTION
    # Kea follows the durable `dhcp` fence (the allocator): `follow_fence` is its hook.
    fence = "dhcp"
    # Kea's config changed through its socket sends no event: look every few seconds.
    # A link appearing may let a waiting interface be served.
    watches = (every(5.0), rtnetlink("link"))

    def __init__(self) -> None:
        # digest → section, for the documents this process has seen (and, on disk, applied).
        self._sections: dict[str, DhcpSection] = {}

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("dhcp", DhcpSection) is not None

    def requirements(self, document: DeviceState) -> list[Requirement]:
        section = document.spec.section("dhcp", DhcpSection)
        if section is None:
            return []
        ha = section.ha is not None
        return [need for family in section.families() for need in kea_requirements(family, ha=ha)]

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("dhcp", DhcpSection)
        families = section.families() if section is not None else []
        facts: Facts = {}
        for family in FAMILIES:
            if section is None or family not in families:
                facts[_path(family, "running")] = None
                continue
            config = compile_config(
                section, family, _canonical_paths(family), list(section.interfaces)
            )
            wanted = digest(config)
            self._sections[wanted] = section
            facts[_path(family, "running")] = True
            facts[_path(family, "config")] = wanted
            facts[_path(family, "file")] = wanted
            facts[_path(family, "interfaces")] = sorted(section.interfaces)
            facts[_path(family, "ha")] = section.ha is not None
            facts[_path(family, "allocation")] = CONSISTENT
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        facts: Facts = {}
        present = {link.name for link in sources.netlink.links()}
        for family in FAMILIES:
            name = daemon_name(family)
            status = sources.daemons.status(name)
            if not status.running:
                facts[_path(family, "running")] = None
                continue
            facts[_path(family, "running")] = True
            paths = kea_paths(sources.daemons.run_dir(name), family)
            ours = _digests_record(paths).read(sources.files)
            try:
                running = _config_get(sources, paths, status.pid)
            except KeaError as exc:
                if _timed_out(exc):
                    # Its socket takes the connection and nothing answers: a hung Kea.
                    # Unobservable, not "running without a configuration" (which a
                    # transaction would converge, and roll back to, through that socket).
                    raise KeaError(
                        f"kea-dhcp{family} (pid {status.pid}) does not answer its control "
                        f"socket: {exc}"
                    ) from exc
                running = {}
            body = _body(running, family)
            if body is not None:
                key = digest(unfenced(body))
                entry = ours.get("kea", {}).get(key)
                facts[_path(family, "config")] = entry["desired"] if entry else f"foreign:{key}"
                if entry is None:
                    # Not only that it differs: where (shown beside the digest by `diff`).
                    changes = self._changes(sources.files, paths, unfenced(body))
                    if changes:
                        facts[_path(family, "changes")] = changes
                facts[_path(family, "ha")] = has_ha(running)
                interfaces = set(body.get("interfaces-config", {}).get("interfaces", []))
                waiting = set(entry.get("declared", [])) - present if entry else set()
                facts[_path(family, "interfaces")] = sorted(interfaces | waiting)
            facts[_path(family, "file")] = _file_fact(sources.files, paths, ours, family)
            facts[_path(family, "allocation")] = allocation_state(
                paths,
                sources.state_dir,
                status.pid,
                running if body is not None else None,
                files=sources.files,
            )
        return facts

    def _changes(self, files: Files, paths: KeaPaths, body: Any) -> list[ConfigChange]:
        """What differs in Kea's running `body` from what it answered when trueup set it."""
        reference = _reference_record(paths).read(files)
        known = reference.get("body")
        if not isinstance(known, dict) or not isinstance(body, dict):
            return []
        wanted = str(reference.get("desired") or "")
        section = self._sections.get(wanted)
        if section is None and wanted:
            try:
                stored = files.read_private(_stored_section(paths, wanted))
                section = DhcpSection.model_validate(json.loads(stored))
            except (OSError, ValueError):
                section = None
        return config_changes(known, body, paths.family, section)

    def diff(self, desired: Facts, observed: Facts) -> list[Difference]:
        """The facts' differences; a foreign configuration also by what differs inside it
        (`spec.dhcp.subnets[0].pools[0]: … → …`, or Kea's own path)."""
        out = super().diff(desired, observed)
        for family in FAMILIES:
            config = _path(family, "config")
            if not any(d.path == config for d in out):
                continue
            for change in observed.get(_path(family, "changes")) or []:
                out.append(
                    Difference(self.name, change["path"], change["desired"], change["observed"])
                )
        return out

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        steps: list[Step] = []
        for family in FAMILIES:
            want_running = desired.get(_path(family, "running"))
            have_running = observed.get(_path(family, "running"))
            if want_running is None:
                if have_running:
                    steps.append(
                        Step(self.name, "stop", _path(family, "running"), {"family": family})
                    )
                continue
            wanted = desired.get(_path(family, "config"))
            if wanted is None:
                continue  # a before-image of a Kea whose configuration was never read
            args = {"family": family, "digest": wanted}
            if not have_running:
                steps.append(Step(self.name, "start", _path(family, "running"), args))
                continue
            config_paths = ("config", "file", "interfaces", "ha")
            if any(
                desired.get(_path(family, p)) != observed.get(_path(family, p))
                for p in config_paths
            ):
                steps.append(Step(self.name, "configure", _path(family, "config"), args))
            if observed.get(_path(family, "allocation")) != CONSISTENT:
                steps.append(
                    Step(self.name, "allocator", _path(family, "allocation"), {"family": family})
                )
        asked = any(desired.get(_path(family, "running")) for family in FAMILIES)
        quiet = "Kea runs the document's configuration" if asked else "no DHCP is asked for"
        return Plan(self.name, steps, [] if steps else [quiet])

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        family = int(step.args["family"])
        name = daemon_name(family)
        paths = kea_paths(sources.daemons.run_dir(name), family)
        try:
            if step.action == "stop":
                sources.daemons.stop(name)
            elif step.action == "start":
                self._start(sources, step, paths)
            elif step.action == "configure":
                self._configure(sources, step, paths)
            elif step.action == "allocator":
                status = sources.daemons.status(name)
                if status.pid is None:
                    raise StepError(step, f"{name} is not running")
                # enforce may set Kea's configuration again (the fence class): the
                # verification asks Kea, not this work's earlier answer.
                sources.memo.pop(_memo_key(paths), None)
                enforce(paths, sources.state_dir, status.pid, files=sources.files)
            else:
                raise ValueError(f"unknown dhcp step {step.action}")
        except (KeaError, DaemonError, OSError) as exc:
            raise StepError(step, str(exc)) from exc

    def _section(self, files: Files, step: Step, paths: KeaPaths) -> DhcpSection:
        wanted = str(step.args["digest"])
        section = self._sections.get(wanted)
        if section is None:
            try:
                stored = files.read_private(_stored_section(paths, wanted))
                section = DhcpSection.model_validate(json.loads(stored))
            except (OSError, ValueError) as exc:
                raise StepError(step, f"no configuration known for {wanted}: {exc}") from exc
            self._sections[wanted] = section
        return section

    def _compiled(
        self, sources: Sources, step: Step, paths: KeaPaths
    ) -> tuple[JSONObject, DhcpSection, list[str]]:
        section = self._section(sources.files, step, paths)
        present = {link.name for link in sources.netlink.links()}
        interfaces = [i for i in section.interfaces if i in present]
        config = compile_config(section, paths.family, paths, interfaces)
        # Kept for a rollback after an agent restart (the section, not Kea's leases).
        stored = _stored_section(paths, str(step.args["digest"]))
        if read_text(sources.files, stored) is None:
            write_file(sources.files, stored, section.model_dump_json(by_alias=True))
        return config, section, interfaces

    def _spec(self, sources: Sources, paths: KeaPaths, config: JSONObject) -> DaemonSpec:
        state_dir, files = sources.state_dir, sources.files

        def before_start() -> None:
            # Every start begins from trueup's configuration: whatever the file holds
            # (an old HA configuration, an edit) is replaced, never the lease file.
            # While the fence is held, Kea starts dropping: no packet is answered
            # before `dhcp-disable` can be sent.
            held = read_fence(state_dir, "dhcp") is not None
            text = json.dumps(with_fence(config, held), indent=2, sort_keys=True) + "\n"
            write_file(files, paths.config, text)
            make_socket_dir(paths)
            # A killed Kea's pid file naming a zombie or a reused pid would make
            # this start fail until the supervisor retries.
            clear_stale_pidfile(paths)

        def after_start(pid: int) -> None:
            enforce(paths, state_dir, pid, files=files)

        return DaemonSpec(
            daemon_name(paths.family),
            paths.argv,
            env=paths.env,
            before_start=before_start,
            after_start=after_start,
            # Started means it answers: one that exits at once fails with its last lines.
            ready=lambda _: kea_answers(paths),
            sockets=paths.socket.parent,
        )

    def _start(self, sources: Sources, step: Step, paths: KeaPaths) -> None:
        config, section, interfaces = self._compiled(sources, step, paths)
        status = sources.daemons.ensure(self._spec(sources, paths, config))
        wait_for_socket(paths)
        if status.pid is not None:
            running = _config_get(sources, paths, status.pid)
            state = allocation_state(
                paths, sources.state_dir, status.pid, running, files=sources.files
            )
            if state != CONSISTENT:
                sources.memo.pop(_memo_key(paths), None)
                enforce(paths, sources.state_dir, status.pid, files=sources.files)
        self._remember(sources, paths, step, section, interfaces, status.pid)

    def _configure(self, sources: Sources, step: Step, paths: KeaPaths) -> None:
        config, section, interfaces = self._compiled(sources, step, paths)
        pid = sources.daemons.status(daemon_name(paths.family)).pid
        # The before-image: what this piece of work observed Kea holding (asked once).
        previous = _config_get(sources, paths, pid)
        sources.memo.pop(_memo_key(paths), None)
        # A reconfiguration never lets a fenced Kea answer: the fence is in what is set.
        held = read_fence(sources.state_dir, "dhcp") is not None
        fenced = with_fence(config, held)
        kea_call(paths, "config-test", _testable(fenced, previous, paths.family))
        kea_call(paths, "config-set", fenced)
        try:
            kea_call(paths, "config-write", {"filename": str(paths.config)})
        except KeaError:
            # The before-image, as it was — fenced as the record says now.
            kea_call(paths, "config-set", with_fence(previous, held))
            raise
        status = sources.daemons.ensure(self._spec(sources, paths, config))
        if status.pid is not None and (held or read_fence(sources.state_dir, "dhcp") is not None):
            # Kea re-enables allocation on some reconfigurations: assert it again.
            enforce(paths, sources.state_dir, status.pid, files=sources.files)
        # Kea confirmed the configuration twice: config-set accepted it, and config-write
        # wrote what it now runs (the same serialisation config-get answers with). That
        # file is what this piece of work's verification sees, without asking again; the
        # next observation (a new piece of work) asks Kea itself.
        written = read_json(sources.files, paths.config)
        if _body(written, paths.family) is not None and pid is not None and status.pid == pid:
            sources.memo[_memo_key(paths)] = (pid, written)
        self._remember(sources, paths, step, section, interfaces, status.pid)

    def _remember(
        self,
        sources: Sources,
        paths: KeaPaths,
        step: Step,
        section: DhcpSection,
        interfaces: list[str],
        pid: int | None,
    ) -> None:
        """Record which Kea digests are trueup's: config-get's and the file's."""
        files = sources.files
        running = _config_get(sources, paths, pid)
        entry: KeaDigest = {
            "desired": str(step.args["digest"]),
            "interfaces": interfaces,
            "declared": list(section.interfaces),
        }
        reference = _body(running, paths.family)
        if reference is not None:
            # What Kea answered for trueup's configuration: what a foreign one is compared with.
            _reference_record(paths).write(
                files, {"desired": entry["desired"], "body": unfenced(reference)}
            )

        def remembered(ours: KeaDigests) -> None:
            for kind, body in (
                ("kea", _body(running, paths.family)),
                ("file", _body(read_json(files, paths.config), paths.family)),
            ):
                if body is None:
                    continue
                table = ours.setdefault("kea", {}) if kind == "kea" else ours.setdefault("file", {})
                key = digest(unfenced(body))
                table.pop(key, None)
                table[key] = entry
                while len(table) > _KEEP:
                    table.pop(next(iter(table)))

        # A cache of what trueup set (lost, the next observation shows a foreign digest
        # and the next pass sets the configuration again): no fsync needed.
        _digests_record(paths).update(files, remembered)

    # -- the fence hook (the CLI and the restore) -----------------------------------
    def follow_fence(
        self,
        state_dir: Path,
        *,
        fenced: bool | None = None,
        wait: float = 5.0,
        end_hung: bool = False,
    ) -> list[FenceFollowed]:
        return follow_fence(state_dir, fenced=fenced, wait=wait, end_hung=end_hung)

    # -- health beyond facts ------------------------------------------------------
    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        section = document.spec.section("dhcp", DhcpSection)
        if section is None:
            return None
        fence = read_fence(sources.state_dir, "dhcp")
        if fence is not None:
            return SubsystemHealth.FENCED, f"fenced by {fence.owner}: {fence.reason}"
        for family in section.families():
            failure = daemon_failure(sources, daemon_name(family))
            if failure is not None:
                return SubsystemHealth.FAILED, failure
        present = {link.name for link in sources.netlink.links()}
        return waiting_on_links([i for i in section.interfaces if i not in present])


def _testable(config: JSONObject, running: JSONObject, family: int) -> JSONObject:
    """`config` as `config-test` can judge it: only interfaces Kea has detected already.

    Kea detects interfaces when it starts and at each `config-set` (`re-detect`),
    never for `config-test`: a link that appeared since (a late NIC) is "doesn't
    exist in the system" to the test, although the set that follows detects and
    binds it. The test keeps every other part; the interfaces it leaves out were
    just seen present in the kernel, and the set itself refuses one that is not.
    """
    body, before = _body(config, family), _body(running, family)
    if not isinstance(body, dict):
        return config
    known_before = before.get("interfaces-config", {}) if isinstance(before, dict) else {}
    known = set(known_before.get("interfaces", []))
    interfaces_config = dict(body.get("interfaces-config", {}))
    wanted = list(interfaces_config.get("interfaces", []))
    interfaces_config["interfaces"] = [i for i in wanted if i in known]
    return {**config, f"Dhcp{family}": {**body, "interfaces-config": interfaces_config}}


def _memo_key(paths: KeaPaths) -> str:
    return f"dhcp:{daemon_name(paths.family)}:config"


def _timed_out(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is a socket's timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError):
            return True
        seen = seen.__cause__
    return False


def _config_get(sources: Sources, paths: KeaPaths, pid: int | None) -> JSONObject:
    """Kea's running configuration, asked once per piece of work and Kea process.

    Reused only within one `Sources` (one observation, or one transaction and its
    workers) and only for the same pid; `_configure` drops it before changing Kea.
    """
    key = _memo_key(paths)
    seen = sources.memo.get(key)
    if pid is not None and seen is not None and seen[0] == pid:
        return dict(seen[1])
    running = kea_call(paths, "config-get", timeout=5.0)
    if pid is not None:
        sources.memo[key] = (pid, running)
    return running


def _file_fact(files: Files, paths: KeaPaths, ours: KeaDigests, family: int) -> str | None:
    body = _body(read_json(files, paths.config), family)
    if body is None:
        return None
    key = digest(unfenced(body))
    entry = ours.get("file", {}).get(key)
    return str(entry["desired"]) if entry else f"foreign:{key}"
