"""HA (`spec.ha`): virtual addresses held by a VRRP role, through keepalived.

What trueup owns: the keepalived process it runs in the router's namespace
(`Sources.daemons`, run directory `STATE_DIR/run/keepalived`, 0700; the
packaged service is never used), its configuration, and the *absence* of
virtual addresses this node does not hold. Which node holds a virtual address
is keepalived's (VRRP election): the presence of a VIP is the role's runtime
state, never drift.

Facts:

| path | desired | observed |
|---|---|---|
| `spec.ha.running` | true (role primary/standby), absent (role none) | the supervisor's verified pid |
| `spec.ha.config` | the compiled keepalived.conf | the file in the run directory |
| `spec.ha.unheld` | `[]` | `IF ADDRESS/LEN` of virtual addresses present while keepalived does not run |

A virtual address on an interface while keepalived is not running is held by
nobody: after a crash (keepalived killed, leaving its addresses), an agent
restart that did not adopt keepalived, or a change to role `none`, it is
removed (`release`), logged and recorded (`report()`: `released`), so that
two routers never answer for one address.

Steps: `release` (always first), `start` (files, `keepalived --config-test`,
start), `configure` (files, test, SIGHUP), `stop` (keepalived sends priority
0 and drops its addresses; what it leaves is released in the same step).
"""

from __future__ import annotations

import hashlib
import logging
import signal
import time
from typing import TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier
from trueup.model.virtual import host_of
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
    step_failures,
    write_file,
)
from trueup.subsystems.ha.section import SECTION, HaSection
from trueup.system.daemonspec import DaemonSpec, DaemonStatusJSON
from trueup.system.keepalived import (
    DAEMON,
    KeepalivedPaths,
    configured_priority,
    instances_for,
    keepalived_paths,
    render_config,
    vrrp_running,
)
from trueup.system.keepalived import REQUIREMENTS as KEEPALIVED_REQUIREMENTS
from trueup.system.requirements import Requirement
from trueup.system.watches import every

__all__ = ["HaSection", "HaSubsystem"]

log = logging.getLogger("trueup.ha")

RUNNING, CONFIG, UNHELD = "spec.ha.running", "spec.ha.config", "spec.ha.unheld"
# Released addresses kept in the record (the newest).
_KEEP_RELEASED = 50


class Released(TypedDict):
    """A virtual address this node removed because nobody held it."""

    interface: str
    address: str
    reason: str
    at: float


class HaRecord(TypedDict, total=False):
    """The run record (`run/keepalived/trueup-ha.json`)."""

    # When trueup last wrote keepalived's configuration (epoch seconds).
    config_written: float
    # The newest released addresses, oldest first.
    released: list[Released]


class HaReport(TypedDict):
    """What status shows beside the facts: keepalived, the VRRP state the kernel shows, and
    the addresses this node released."""

    keepalived: DaemonStatusJSON
    # From the kernel: MASTER holds every configured address, BACKUP none (or "stopped",
    # "unknown", "partial").
    state: str
    priority: int | None
    holds: list[str]
    present_unheld: list[str]
    released: list[Released]


def _record(paths: KeepalivedPaths) -> RunRecord[HaRecord]:
    return RunRecord(paths.record)


def compile_config(document: DeviceState) -> str | None:
    """keepalived.conf for `document`'s `spec.ha`, or None when no VIP is to be held."""
    section = document.spec.section("ha", HaSection)
    if section is None or section.role == "none":
        return None
    instances = instances_for(
        [(v.interface, v.vrid, list(v.addresses)) for v in section.vips], list(section.peers)
    )
    return render_config(
        router_id=f"trueup-{document.metadata.device}",
        instances=instances,
        priority=section.effective_priority(),
        advert_interval=section.advert_interval,
        preempt=section.preempt,
        initial_master=section.role == "primary",
    )


class HaSubsystem(Subsystem):
    name = "ha"
    tier = Tier.SERVICES
    # Virtual addresses go on managed interfaces, beside their own addresses.
    depends_on = ("addresses",)
    section = SECTION
    # keepalived's death and edits of its file (whose path depends on the state
    # directory) are seen at this period, besides the supervisor's own restarts.
    watches = (every(3.0),)

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        """A daemon the document asks for that is not running: failed, in its own words."""
        if not self.configured(document) or compile_config(document) is None:
            return None
        return failed_daemon(sources, DAEMON)

    def __init__(self) -> None:
        self._configs: dict[str, str] = {}

    def requirements(self, document: DeviceState) -> list[Requirement]:
        # keepalived runs only for a role that holds virtual addresses.
        return list(KEEPALIVED_REQUIREMENTS) if compile_config(document) is not None else []

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("ha", HaSection) is not None

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        config = compile_config(document)
        if config is None:
            return {RUNNING: None, UNHELD: []}
        return {RUNNING: True, CONFIG: config, UNHELD: []}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        running = sources.daemons.running(DAEMON)
        facts: Facts = {RUNNING: True if running else None, UNHELD: []}
        if running or scope.virtual_addresses:
            paths = keepalived_paths(sources.daemons.run_dir(DAEMON))
            text = read_text(sources.files, paths.config)
            if text is not None:
                facts[CONFIG] = text
        if not running and scope.virtual_addresses:
            facts[UNHELD] = sorted(
                f"{a.ifname} {a.prefix}"
                for a in sources.netlink.addresses()
                if scope.is_virtual(a.prefix)
            )
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        steps: list[Step] = []
        unheld = list(observed.get(UNHELD) or [])
        if desired.get(RUNNING) is None:
            if observed.get(RUNNING):
                steps.append(Step(self.name, "stop", RUNNING))
                # What keepalived leaves behind on its way out is nobody's.
                all_vips = sorted(scope.virtual_addresses)
                steps.append(
                    Step(self.name, "release", UNHELD, {"all": all_vips, "reason": "role none"})
                )
            elif unheld:
                steps.append(
                    Step(self.name, "release", UNHELD, {"present": unheld, "reason": "role none"})
                )
            return Plan(self.name, steps, [] if steps else ["no virtual address is held here"])
        if unheld:
            steps.append(
                Step(
                    self.name,
                    "release",
                    UNHELD,
                    {"present": unheld, "reason": "keepalived not running"},
                )
            )
        config = str(desired.get(CONFIG) or "")
        # Steps name the configuration by digest (they are logged and journaled); the
        # text stays with this subsystem until the step runs.
        wanted = hashlib.sha256(config.encode()).hexdigest()[:16]
        self._configs[wanted] = config
        if not observed.get(RUNNING):
            steps.append(Step(self.name, "start", RUNNING, {"digest": wanted}))
        elif observed.get(CONFIG) != config:
            steps.append(Step(self.name, "configure", CONFIG, {"digest": wanted}))
        return Plan(self.name, steps, [] if steps else ["keepalived runs the document's VRRP"])

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        paths = keepalived_paths(sources.daemons.run_dir(DAEMON))
        with step_failures(step):
            if step.action == "release":
                self._release(sources, paths, step)
            elif step.action == "stop":
                sources.daemons.stop(DAEMON)
            elif step.action in ("start", "configure"):
                self._start(sources, paths, step)
            else:
                raise ValueError(f"unknown ha step {step.action}")

    def _start(self, sources: Sources, paths: KeepalivedPaths, step: Step) -> None:
        known = self._configs.get(str(step.args["digest"]))
        if known is None:
            raise StepError(step, "no configuration known for this digest (plan again)")
        config = known
        files = sources.files
        # Checked from a scratch copy first: a refused configuration never replaces
        # the one keepalived runs.
        scratch = paths.run_dir / "keepalived.conf.check"
        result = check(sources, scratch, config, paths.test_argv(scratch), timeout=15.0)
        if result.returncode != 0:
            output = " ".join((result.stderr or result.stdout or "").split())[:400]
            raise StepError(step, f"keepalived refused the configuration: {output}")

        def before_start() -> None:
            write_file(files, paths.config, config)
            paths.clear_stale_pid_files()

        def written(record: HaRecord) -> None:
            record["config_written"] = time.time()

        _record(paths).update(files, written)
        # Started means its VRRP child runs: a keepalived that exits at once is a
        # failed step with its own last lines (the supervisor's DaemonError), not a heal.
        spec = DaemonSpec(
            DAEMON,
            paths.argv,
            before_start=before_start,
            ready=lambda pid: vrrp_running(paths, pid),
        )
        if step.action == "start":
            sources.daemons.ensure(spec)
            return
        # Running: the new file, then SIGHUP (keepalived reads it again).
        ensure_or_reload(
            sources,
            spec,
            signal.SIGHUP,
            before_reload=lambda: write_file(files, paths.config, config),
            gone="keepalived is not running; cannot reload it",
        )

    def _release(self, sources: Sources, paths: KeepalivedPaths, step: Step) -> None:
        reason = str(step.args.get("reason", ""))
        if "all" in step.args:
            hosts = {host_of(a) for a in step.args["all"]}
            present = [
                f"{a.ifname} {a.prefix}"
                for a in sources.netlink.addresses()
                if host_of(a.prefix) in hosts
            ]
        else:
            present = list(step.args["present"])
        released: list[Released] = []
        for entry in present:
            ifname, prefix = entry.split(" ", 1)
            try:
                sources.netlink.del_address(ifname, prefix)
            except Exception as exc:  # already gone: nothing held, nothing to do
                if any(host_of(a.prefix) == host_of(prefix) for a in sources.netlink.addresses()):
                    raise StepError(step, f"cannot remove {prefix} from {ifname}: {exc}") from exc
                continue
            log.warning(
                "released virtual address %s on %s (%s): this node does not hold it",
                prefix,
                ifname,
                reason,
            )
            released.append(
                {"interface": ifname, "address": prefix, "reason": reason, "at": time.time()}
            )
        if released:

            def add(record: HaRecord) -> None:
                record["released"] = (list(record.get("released", [])) + released)[-_KEEP_RELEASED:]

            _record(paths).update(sources.files, add)

    # -- status -----------------------------------------------------------------
    def report(self, sources: Sources, scope: Scope) -> HaReport:
        paths = keepalived_paths(sources.daemons.run_dir(DAEMON))
        status = sources.daemons.status(DAEMON)
        present = sorted(
            f"{a.ifname} {a.prefix}"
            for a in sources.netlink.addresses()
            if scope.is_virtual(a.prefix)
        )
        config = read_text(sources.files, paths.config) if status.running else None
        mine = _configured_addresses(config)
        held = [p for p in present if p in mine]
        if not status.running:
            state = "stopped"
        elif not mine:
            state = "unknown"
        elif len(held) == len(mine):
            state = "MASTER"
        elif not held:
            state = "BACKUP"
        else:
            state = "partial"
        record = _record(paths).read(sources.files)
        return {
            "keepalived": status.to_json(),
            # From the kernel: MASTER holds every configured address, BACKUP none.
            "state": state,
            "priority": configured_priority(config),
            "holds": held,
            "present_unheld": [] if status.running else present,
            "released": list(record.get("released", []))[-10:],
        }


def _configured_addresses(config: str | None) -> set[str]:
    """`IF ADDRESS/LEN` for every `ADDRESS/LEN dev IF` line of a configuration."""
    out: set[str] = set()
    for line in (config or "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "dev" and "/" in parts[0]:
            out.add(f"{parts[2]} {parts[0]}")
    return out
