"""DNS (`spec.dns`): a local zone served by Knot DNS, static records and records from leases.

What trueup owns: the Knot process it starts in the router's namespace
(`Sources.daemons`, run directory `STATE_DIR/run/knot`, 0700, files 0600; the
packaged `knot` service is never used), its configuration, the zones the
section names (the zone and its reverse zones) and every record in them.
What it never owns: the leases. They are read through the read-only lease
inspection (`trueup.system.kealeases`), never through Kea's configuration.

Facts:

| path | desired | observed |
|---|---|---|
| `spec.dns.running` | true | the supervisor's verified pid |
| `spec.dns.listen` | `ADDRESS@PORT`s | `knotc conf-read server.listen` |
| `spec.dns.zones` | the zone and reverse zones | `knotc conf-read zone.domain` |
| `spec.dns.zones[Z].records` | static records | `knotc zone-read Z` less SOA and lease records |
| `spec.dns.zones[Z].file` | static records | the zone file Knot starts from, less SOA |
| `spec.dns.leases` | lease settings, `records: follow the leases` | the settings of the last sync; whether the zones hold exactly what the leases give now |

**Why trueup writes lease records itself (through `knotc`) rather than Kea's
DDNS (`kea-dhcp-ddns` sending RFC 2136 updates):** the records must be seeded
at startup from the read-only lease inspection anyway — with Kea stopped,
fenced or not configured — and DDNS only reports lease *changes*, so trueup
would need the lease → record mapping in any case; with one writer there is
one mapping, one place to compare records against leases (drift), and no
coupling to DHCP: DDNS would mean the DNS subsystem reconfiguring Kea (a
`dhcp-ddns` section, a second daemon, TSIG keys), which subsystems may not
do to each other and the incident forbids during recovery. The cost: records
follow leases at the periodic look (`every(5.0)`, also Kea's own cadence for
config drift) instead of at once; docs/dns.md has the details.

Steps: `start`/`configure` (config and zone files, start/restart Knot),
`write-zone-file`, `set-records` (one zone transaction: `zone-begin`,
`zone-unset`/`zone-set`, `zone-commit`; `zone-abort` on refusal),
`sync-leases` (the same, from the leases; always last, so a seeding failure
leaves the static records served and fails DNS alone), `stop`.

Why this module is over 400 lines: the facts, the steps and Knot's daemon
specification share one reading of the run directory's state record (the
static and lease records last written); split, each would re-derive it.
"""

from __future__ import annotations

import time
from typing import TypedDict

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
    failed_daemon,
    read_text,
    step_failures,
    write_file,
)
from trueup.subsystems.dns.records import (
    LeaseSettings,
    lease_records,
    parse_zone_file,
    render_zone_file,
)
from trueup.subsystems.dns.section import SECTION, DnsSection
from trueup.system.daemonspec import DaemonSpec
from trueup.system.kea import daemon_name, kea_paths
from trueup.system.kealeases import Lease, read_leases
from trueup.system.knot import (
    DAEMON,
    KnotControl,
    KnotError,
    KnotPaths,
    clear_stale_pidfile,
    knot_paths,
    render_config,
)
from trueup.system.knot import REQUIREMENTS as KNOT_REQUIREMENTS
from trueup.system.requirements import Requirement
from trueup.system.sockets import make_socket_dir
from trueup.system.sources import Files
from trueup.system.watches import every

__all__ = ["DnsSection", "DnsSubsystem"]

FOLLOWS = "follow the leases"
RUNNING, LISTEN, ZONES, LEASES = (
    "spec.dns.running",
    "spec.dns.listen",
    "spec.dns.zones",
    "spec.dns.leases",
)
_READY_TIMEOUT = 15.0


class DnsLeaseSettings(TypedDict):
    """What lease records are made from (`spec.dns.leases`, as the last sync used it)."""

    zone: str
    ttl: int
    reverse: list[str]
    lease4_file: str | None
    lease6_file: str | None


class DnsState(TypedDict, total=False):
    """The run record (`run/knot/trueup-dns.json`): the records trueup last wrote."""

    # Zone → the static records set (the document's).
    static: dict[str, list[str]]
    # Zone → the records written from the leases at the last sync.
    dynamic: dict[str, list[str]]
    # The lease settings of the last sync (None: no lease records).
    leases: DnsLeaseSettings | None


def _record(paths: KnotPaths) -> RunRecord[DnsState]:
    return RunRecord(paths.state)


def _zone_path(zone: str, what: str) -> str:
    return f"spec.dns.zones[{zone}].{what}"


def _soa(record: str) -> bool:
    return record.split(" ", 3)[2] == "SOA"


class DnsSubsystem(Subsystem):
    name = "dns"
    tier = Tier.SERVICES
    # Listen addresses are on managed interfaces. Not on `dhcp`: seeding reads
    # leases without Kea, and a DHCP failure must not hold DNS back.
    depends_on = ("addresses",)
    section = SECTION
    # knotc edits and lease changes send no event trueup can name in advance
    # (the lease file's path depends on the state directory): look every 5 s.
    watches = (every(5.0),)

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        """A daemon the document asks for that is not running: failed, in its own words."""
        return failed_daemon(sources, DAEMON) if self.configured(document) else None

    def requirements(self, document: DeviceState) -> list[Requirement]:
        del document
        return list(KNOT_REQUIREMENTS)

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("dns", DnsSection) is not None

    # -- facts ------------------------------------------------------------------
    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("dns", DnsSection)
        if section is None:
            return {RUNNING: None}
        facts: Facts = {
            RUNNING: True,
            LISTEN: sorted(section.listen),
            ZONES: sorted(section.zones()),
        }
        for zone, records in section.static_records().items():
            facts[_zone_path(zone, "records")] = records
            facts[_zone_path(zone, "file")] = records
        leases = section.leases
        facts[LEASES] = None
        if leases is not None:
            facts[LEASES] = {
                "zone": section.zone,
                "ttl": leases.ttl,
                "reverse": list(section.reverse),
                "lease4_file": leases.lease4_file,
                "lease6_file": leases.lease6_file,
                "records": FOLLOWS,
            }
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        if not sources.daemons.running(DAEMON):
            return {RUNNING: None}
        paths = knot_paths(sources.daemons.run_dir(DAEMON))
        knot = KnotControl(sources.runner, paths.socket)
        facts: Facts = {RUNNING: True}
        try:
            facts[LISTEN] = sorted(knot.conf_read("server.listen"))
            zones = sorted(knot.conf_read("zone.domain"))
        except KnotError:
            return facts  # not answering (yet): listen differs, and a restart is planned
        facts[ZONES] = zones
        state = _record(paths).read(sources.files)
        static = state.get("static", {})
        applied = state.get("dynamic", {})
        settings = state.get("leases")
        expected: dict[str, set[str]] = {}
        problem = ""
        if settings is not None:
            try:
                expected = _expected(sources, settings, static)
            except (OSError, ValueError) as exc:
                problem = f"cannot read the leases: {exc}"
        missing: list[str] = []
        stale: list[str] = []
        for zone in zones:
            facts[_zone_path(zone, "file")] = _zone_file(sources.files, paths, zone)
            try:
                live = {r for r in knot.read_zone(zone) if not _soa(r)}
            except KnotError:
                facts[_zone_path(zone, "records")] = None
                continue
            owned = set(static.get(zone, []))
            wanted = expected.get(zone, set())
            dynamic = (live & (wanted | set(applied.get(zone, [])))) - owned
            facts[_zone_path(zone, "records")] = sorted(live - dynamic)
            missing += sorted(wanted - live)
            stale += sorted(dynamic - wanted)
        if settings is not None:
            facts[LEASES] = {**settings, "records": problem or _verdict(missing, stale)}
        else:
            facts[LEASES] = None
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        steps: list[Step] = []
        if desired.get(RUNNING) is None:
            if observed.get(RUNNING):
                steps.append(Step(self.name, "stop", RUNNING))
            return Plan(self.name, steps, [] if steps else ["no DNS is asked for"])
        zones = list(desired.get(ZONES) or [])
        static = {z: list(desired.get(_zone_path(z, "records")) or []) for z in zones}
        config = {"listen": desired.get(LISTEN) or [], "zones": zones, "static": static}
        restarted = False
        if not observed.get(RUNNING):
            steps.append(Step(self.name, "start", RUNNING, config))
            restarted = True
        elif any(desired.get(p) != observed.get(p) for p in (LISTEN, ZONES)):
            steps.append(Step(self.name, "configure", ZONES, config))
            restarted = True
        else:
            for zone in zones:
                records = static[zone]
                if observed.get(_zone_path(zone, "file")) != records:
                    path = _zone_path(zone, "file")
                    steps.append(
                        Step(self.name, "write-zone-file", path, {"zone": zone, "records": records})
                    )
                if observed.get(_zone_path(zone, "records")) != records:
                    path = _zone_path(zone, "records")
                    steps.append(
                        Step(self.name, "set-records", path, {"zone": zone, "records": records})
                    )
        wanted, have = desired.get(LEASES), observed.get(LEASES)
        if (restarted and wanted is not None) or wanted != have:
            settings = {k: v for k, v in wanted.items() if k != "records"} if wanted else None
            owners = sorted({r.split(" ", 1)[0] for rs in static.values() for r in rs})
            args = {"settings": settings, "static_owners": owners}
            steps.append(Step(self.name, "sync-leases", LEASES, args))
        return Plan(self.name, steps, [] if steps else ["Knot serves the document's zones"])

    # -- steps ------------------------------------------------------------------
    def execute(self, sources: Sources, step: Step) -> None:
        paths = knot_paths(sources.daemons.run_dir(DAEMON))
        knot = KnotControl(sources.runner, paths.socket)
        with step_failures(step, KnotError):
            if step.action == "stop":
                sources.daemons.stop(DAEMON)
            elif step.action in ("start", "configure"):
                self._start(sources, step, paths, knot)
            elif step.action == "write-zone-file":
                zone, records = step.args["zone"], list(step.args["records"])
                _write_zone_file(sources.files, paths, zone, records)

                def written(state: DnsState) -> None:
                    state.setdefault("static", {})[zone] = records

                _record(paths).update(sources.files, written)
            elif step.action == "set-records":
                zone, records = str(step.args["zone"]), list(step.args["records"])
                self._set_records(sources.files, paths, knot, zone, records)
            elif step.action == "sync-leases":
                self._sync_leases(sources, paths, knot, step)
            else:
                raise ValueError(f"unknown dns step {step.action}")

    def _start(self, sources: Sources, step: Step, paths: KnotPaths, knot: KnotControl) -> None:
        static: dict[str, list[str]] = {z: list(r) for z, r in step.args["static"].items()}
        config = render_config(paths, step.args["listen"], step.args["zones"])
        files, run_record = sources.files, _record(paths)
        for directory in (paths.zones, paths.db):
            files.make_private_dir(directory)

        def no_lease_records(state: DnsState) -> None:
            state["dynamic"] = {}  # Knot starts from the zone files: no lease records yet

        def record(state: DnsState) -> None:
            state["static"] = static
            no_lease_records(state)

        def before_start() -> None:
            # Every start begins from trueup's files: the config, and zone files
            # holding the static records trueup last set.
            write_file(files, paths.config, config)
            make_socket_dir(paths.socket.parent, paths.run_dir)  # when moved out of run/
            # A killed Knot's pid file naming its zombie (or a reused pid) would make
            # this start fail ("already running").
            clear_stale_pidfile(paths)
            current = run_record.read(files).get("static", static)
            for zone in step.args["zones"]:
                _write_zone_file(files, paths, zone, current.get(zone, []))
            run_record.update(files, no_lease_records)

        run_record.update(files, record)
        # Started means knotc reaches it: one that exits at once fails with its last lines.
        spec = DaemonSpec(
            DAEMON,
            paths.argv,
            before_start=before_start,
            ready=lambda _: knot.ready(),
            sockets=paths.socket.parent,
        )
        if step.action == "configure":
            sources.daemons.ensure(spec)
            sources.daemons.restart(DAEMON)
        else:
            sources.daemons.ensure(spec)
        knot.wait_ready(_READY_TIMEOUT)

    def _set_records(
        self, files: Files, paths: KnotPaths, knot: KnotControl, zone: str, records: list[str]
    ) -> None:
        state = _record(paths).read(files)
        dynamic = set(state.get("dynamic", {}).get(zone, [])) - set(records)
        live = {r for r in knot.read_zone(zone) if not _soa(r)}
        current = live - dynamic
        knot.change_zone(
            zone, remove=sorted(current - set(records)), add=sorted(set(records) - live)
        )

        def record(s: DnsState) -> None:
            s.setdefault("static", {})[zone] = records
            dynamic = s.setdefault("dynamic", {})
            dynamic[zone] = sorted(set(dynamic.get(zone, [])) - set(records))

        _record(paths).update(files, record)

    def _sync_leases(
        self, sources: Sources, paths: KnotPaths, knot: KnotControl, step: Step
    ) -> None:
        settings: DnsLeaseSettings | None = step.args["settings"]
        state = _record(paths).read(sources.files)
        static = state.get("static", {})
        expected: dict[str, set[str]] = {}
        if settings is not None:
            try:
                expected = _expected(sources, settings, static, step.args["static_owners"])
            except (OSError, ValueError) as exc:
                raise StepError(step, f"seeding from the leases failed: {exc}") from exc
        applied = state.get("dynamic", {})
        written: dict[str, list[str]] = {}
        for zone in sorted(set(expected) | set(applied)):
            try:
                live = {r for r in knot.read_zone(zone) if not _soa(r)}
            except KnotError:
                continue  # a zone Knot no longer serves holds no records to remove
            owned = set(static.get(zone, []))
            wanted = expected.get(zone, set()) - owned
            stale = (live & set(applied.get(zone, []))) - wanted - owned
            knot.change_zone(zone, remove=sorted(stale), add=sorted(wanted - live))
            written[zone] = sorted(wanted)

        def record(s: DnsState) -> None:
            s["dynamic"] = written
            s["leases"] = settings

        _record(paths).update(sources.files, record)


def _verdict(missing: list[str], stale: list[str]) -> str:
    if not missing and not stale:
        return FOLLOWS
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:3])}" + (" …" if len(missing) > 3 else ""))
    if stale:
        parts.append(f"stale {', '.join(stale[:3])}" + (" …" if len(stale) > 3 else ""))
    return "; ".join(parts)


def _leases(sources: Sources, settings: DnsLeaseSettings) -> list[Lease]:
    """Every lease, Kea running or not: its socket if it answers, else its memfile."""
    out: list[Lease] = []
    for family in (4, 6):
        override = settings.get("lease4_file") if family == 4 else settings.get("lease6_file")
        if override:
            _source, leases = read_leases(family, socket_path=None, lease_file=override)
        else:
            paths = kea_paths(sources.daemons.run_dir(daemon_name(family)), family)
            _source, leases = read_leases(family, socket_path=paths.socket, lease_file=paths.leases)
        out.extend(leases)
    return out


def _expected(
    sources: Sources,
    settings: DnsLeaseSettings,
    static: dict[str, list[str]],
    owners: list[str] | None = None,
) -> dict[str, set[str]]:
    if owners is None:
        owners = [r.split(" ", 1)[0] for records in static.values() for r in records]
    lease_settings = LeaseSettings(
        zone=str(settings["zone"]),
        ttl=int(settings["ttl"]),
        reverse=tuple(settings.get("reverse", [])),
        static_owners=frozenset(owners),
    )
    return lease_records(_leases(sources, settings), lease_settings, time.time()).records


def _zone_file(files: Files, paths: KnotPaths, zone: str) -> list[str] | None:
    text = read_text(files, paths.zone_file(zone))  # None: missing, or the write names it
    return parse_zone_file(text) if text is not None else None


def _write_zone_file(files: Files, paths: KnotPaths, zone: str, records: list[str]) -> None:
    # The daemon's files are the agent's alone (0600 in a 0700 directory).
    text = render_zone_file(zone, records, serial=int(time.time()))
    write_file(files, paths.zone_file(zone), text)
