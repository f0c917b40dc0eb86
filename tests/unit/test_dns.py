"""The DNS subsystem on fakes: section paths, canonical records, lease rules, plans, steps, rollback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import DocumentError, parse_document
from trueup.reconcile.engine import Engine
from trueup.subsystems.base import StepError
from trueup.subsystems.dns.records import (
    LeaseSettings,
    lease_records,
    parse_zone_file,
    render_zone_file,
    reverse_zone,
)
from trueup.subsystems.dns.subsystem import FOLLOWS, DnsSubsystem
from trueup.subsystems.registry import scope_for
from trueup.system.daemonspec import DaemonSpec
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink
from trueup.system.fakeknot import FakeKnotc
from trueup.system.kealeases import Lease
from trueup.system.knot import knot_paths
from trueup.system.sources import Sources

HEADER = "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,hostname,state,user_context"
ZONE = "lan.test."
REVERSE = "113.0.203.in-addr.arpa."


class KnotDaemons(FakeDaemons):
    """FakeDaemons whose Knot loads the files trueup wrote, like knotd at start."""

    def __init__(self, run_root: Path, knotc: FakeKnotc) -> None:
        super().__init__(run_root)
        self.knotc = knotc

    def _start(self, spec: DaemonSpec) -> None:
        super()._start(spec)
        if spec.name == "knot":
            self.knotc.start_from(knot_paths(self.run_dir("knot")))

    def stop(self, name: str) -> None:
        super().stop(name)
        if name == "knot":
            self.knotc.answering = False


def section(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "zone": "LAN.test",
        "listen": ["203.0.113.1", "2001:db8:1:0::1@5353"],
        "records": [
            {"name": "router", "type": "A", "value": "203.0.113.1"},
            {"name": "www", "type": "CNAME", "value": "router", "ttl": 60},
            {"name": "@", "type": "TXT", "value": 'say "hi"'},
            {"name": "1.113.0.203.in-addr.arpa.", "type": "PTR", "value": "router"},
        ],
        "reverse": ["203.0.113.0/24"],
    }
    out.update(extra)
    return out


def lease(address: str, hostname: str, *, expire: float | None = None, **kw: Any) -> Lease:
    fields: dict[str, Any] = {
        "family": 4 if ":" not in address else 6,
        "address": address,
        "hwaddr": "02:00:00:00:00:01",
        "client_id": "",
        "hostname": hostname,
        "expire": int(expire if expire is not None else time.time() + 3600),
        "valid_lifetime": 3600,
        "subnet_id": 1,
        "state": "default",
    }
    fields.update(kw)
    return Lease(**fields)


def test_section_errors_name_the_path() -> None:
    bad = section(
        listen=["203.0.113.1@99999"],
        reverse=["203.0.112.0/20"],
        records=[
            {"name": "a", "type": "A", "value": "2001:db8::1"},
            {"name": "x.other.", "type": "A", "value": "192.0.2.1"},
        ],
    )
    with pytest.raises(DocumentError) as refused:
        parse_document(base_document(dns=bad))
    problems = "\n".join(refused.value.problems)
    assert "spec.dns.listen[0]" in problems and "port" in problems
    assert "spec.dns.reverse[0]" in problems and "multiple of 8" in problems
    with pytest.raises(DocumentError) as refused:
        parse_document(base_document(dns=section(records=[bad["records"][0]])))
    assert "records[0]: value '2001:db8::1' is not an IPv4 address" in str(refused.value)
    with pytest.raises(DocumentError) as refused:
        parse_document(base_document(dns=section(records=[bad["records"][1]])))
    assert "spec.dns.records[0].name: x.other. is outside the zones lan.test." in str(refused.value)
    cname_clash = [
        {"name": "www", "type": "CNAME", "value": "router"},
        {"name": "www", "type": "A", "value": "192.0.2.1"},
    ]
    with pytest.raises(DocumentError) as refused:
        parse_document(base_document(dns=section(records=cname_clash)))
    assert refused.value.problems == [
        "spec.dns.records[0]: www.lan.test. has a CNAME and other records"
    ]


def test_every_record_problem_is_reported_at_its_full_path() -> None:
    records = [
        {"name": "router", "type": "A", "value": "203.0.113.1"},
        {"name": "x.example.org.", "type": "A", "value": "203.0.113.9"},
        {"name": "bad", "type": "A", "value": "2001:db8::1"},
    ]
    with pytest.raises(DocumentError) as refused:
        parse_document(base_document(dns=section(records=records)))
    assert refused.value.problems == [
        "spec.dns.records[1].name: x.example.org. is outside the zones lan.test., "
        "113.0.203.in-addr.arpa. (a name ending in a dot is absolute; declare a reverse "
        "zone under reverse:)",
        "spec.dns.records[2]: value '2001:db8::1' is not an IPv4 address",
    ]


def test_records_are_canonical_as_knot_prints_them() -> None:
    document = parse_document(base_document(dns=section()))
    dns = document.spec.section("dns")
    assert dns.listen == ["203.0.113.1@53", "2001:db8:1::1@5353"]
    assert dns.static_records() == {
        ZONE: [
            'lan.test. 300 TXT "say \\"hi\\""',
            "router.lan.test. 300 A 203.0.113.1",
            "www.lan.test. 60 CNAME router.lan.test.",
        ],
        REVERSE: ["1.113.0.203.in-addr.arpa. 300 PTR router.lan.test."],
    }
    assert reverse_zone("2001:db8:1::/64") == "0.0.0.0.1.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa."
    assert reverse_zone("2001:db8:1::/48") == "1.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa."
    text = render_zone_file(ZONE, dns.static_records()[ZONE], serial=7)
    assert parse_zone_file(text) == dns.static_records()[ZONE]
    assert "unparsed: garbage here" in parse_zone_file(text + "garbage here\n")


def test_lease_rules() -> None:
    settings = LeaseSettings(
        ZONE, 60, ("203.0.113.0/24",), static_owners=frozenset({"router.lan.test."})
    )
    now = time.time()
    view = lease_records(
        [
            lease("203.0.113.100", "Laptop.lan.test."),  # FQDN in the zone → laptop
            lease("203.0.113.101", "router"),  # a static name is never taken
            lease("203.0.113.102", "old", expire=now - 1),  # expired
            lease("203.0.113.103", "declined", state="declined"),
            lease("203.0.113.104", "bad_name!"),
            lease("203.0.113.105", "phone", expire=now + 100),
            lease("203.0.113.106", "phone", expire=now + 900),  # expires last: wins alone
            lease("198.51.100.50", "far"),  # no reverse zone holds it: no PTR
            lease("2001:db8:1::50", "laptop", lease_type="IA_NA"),
        ],
        settings,
        now,
    )
    assert view.records == {
        ZONE: {
            "laptop.lan.test. 60 A 203.0.113.100",
            "laptop.lan.test. 60 AAAA 2001:db8:1::50",
            "phone.lan.test. 60 A 203.0.113.106",
            "far.lan.test. 60 A 198.51.100.50",
        },
        REVERSE: {
            "100.113.0.203.in-addr.arpa. 60 PTR laptop.lan.test.",
            "106.113.0.203.in-addr.arpa. 60 PTR phone.lan.test.",
        },
    }
    assert any("router.lan.test. has static records" in s for s in view.skipped)
    assert any("'bad_name!' is not a label" in s for s in view.skipped)


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.knotc = FakeKnotc()
        self.daemons = KnotDaemons(tmp_path / "run", self.knotc)
        self.lease_file = tmp_path / "leases4.csv"
        self.sources = Sources(
            FakeNetlink(), FakeFiles(), self.knotc, state_dir=tmp_path, daemons=self.daemons
        )
        self.sub = DnsSubsystem()

    def leases(self, *rows: str) -> None:
        self.lease_file.write_text("\n".join([HEADER, *rows]) + "\n")

    def document(self, **extra: Any) -> Any:
        leases = {"ttl": 60, "lease4_file": str(self.lease_file), "lease6_file": "/nonexistent"}
        return parse_document(base_document(dns=section(leases=leases, **extra)))

    def converge(self, document: Any) -> list[str]:
        scope = scope_for(document)
        desired = self.sub.desired(document, scope)
        plan = self.sub.plan(desired, self.sub.observe(self.sources, scope), scope)
        for step in plan.steps:
            self.sub.execute(self.sources, step)
        return [s.action for s in plan.steps]

    def diffs(self, document: Any) -> list[str]:
        scope = scope_for(document)
        desired = self.sub.desired(document, scope)
        return [d.path for d in self.sub.diff(desired, self.sub.observe(self.sources, scope))]


def row(address: str, hostname: str, valid: int = 3600) -> str:
    return f"{address},02:00:00:00:00:01,,{valid},{int(time.time()) + valid},1,0,0,{hostname},0,"


def test_start_seed_drift_and_lease_changes_on_fakes(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.leases(row("203.0.113.120", "laptop"))
    document = rig.document()
    assert rig.converge(document) == ["start", "sync-leases"]
    assert rig.daemons.alive["knot"]
    run = knot_paths(rig.daemons.run_dir("knot"))
    assert run.config.stat().st_mode & 0o777 == 0o600
    assert 'listen: [ "2001:db8:1::1@5353", "203.0.113.1@53" ]' in run.config.read_text()
    assert "laptop.lan.test. 60 A 203.0.113.120" in rig.knotc.zones[ZONE]
    assert "120.113.0.203.in-addr.arpa. 60 PTR laptop.lan.test." in rig.knotc.zones[REVERSE]
    assert rig.diffs(document) == []
    assert rig.converge(document) == []

    # A static record replaced behind trueup's back: drift on the records, not the leases.
    rig.knotc.zones[ZONE].remove("router.lan.test. 300 A 203.0.113.1")
    rig.knotc.zones[ZONE].append("router.lan.test. 300 A 192.0.2.66")
    assert rig.diffs(document) == ["spec.dns.zones[lan.test.].records"]
    assert rig.converge(document) == ["set-records"]
    assert "router.lan.test. 300 A 203.0.113.1" in rig.knotc.zones[ZONE]
    assert "router.lan.test. 300 A 192.0.2.66" not in rig.knotc.zones[ZONE]
    assert "laptop.lan.test. 60 A 203.0.113.120" in rig.knotc.zones[ZONE]  # untouched

    # A lease record removed by hand, and the lease file moving on: the leases fact.
    rig.knotc.zones[ZONE].remove("laptop.lan.test. 60 A 203.0.113.120")
    scope = scope_for(document)
    observed = rig.sub.observe(rig.sources, scope)
    assert observed["spec.dns.leases"]["records"] == "missing laptop.lan.test. 60 A 203.0.113.120"
    rig.leases(row("203.0.113.120", "laptop", valid=0), row("203.0.113.130", "phone"))
    assert rig.diffs(document) == ["spec.dns.leases"]
    assert rig.converge(document) == ["sync-leases"]
    assert "phone.lan.test. 60 A 203.0.113.130" in rig.knotc.zones[ZONE]
    assert not any("laptop" in r for r in rig.knotc.zones[ZONE] + rig.knotc.zones[REVERSE])
    assert rig.sub.observe(rig.sources, scope)["spec.dns.leases"]["records"] == FOLLOWS

    # The zone file edited: drift on the file, written back.
    zone_file = run.zone_file(ZONE)
    zone_file.write_text(zone_file.read_text() + "evil.lan.test. 300 IN A 192.0.2.9\n")
    assert rig.diffs(document) == ["spec.dns.zones[lan.test.].file"]
    assert rig.converge(document) == ["write-zone-file"]
    assert "evil" not in zone_file.read_text()

    # The section removed: Knot stopped.
    assert rig.converge(parse_document(base_document())) == ["stop"]
    assert not rig.daemons.alive["knot"]


def test_a_broken_lease_file_fails_the_seeding_step_and_leaves_static_records(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.lease_file.write_text("not a lease file\n1,2\n")
    document = rig.document()
    scope = scope_for(document)
    plan = rig.sub.plan(
        rig.sub.desired(document, scope), rig.sub.observe(rig.sources, scope), scope
    )
    assert [s.action for s in plan.steps] == ["start", "sync-leases"]  # seeding is last
    rig.sub.execute(rig.sources, plan.steps[0])
    with pytest.raises(StepError, match=r"seeding from the leases failed: .*not a Kea lease file"):
        rig.sub.execute(rig.sources, plan.steps[1])
    assert "router.lan.test. 300 A 203.0.113.1" in rig.knotc.zones[ZONE]
    assert not any(c[:1] == ("kea-dhcp4",) for c in rig.knotc.calls)  # Kea never touched


def test_a_refused_record_changes_nothing_in_the_zone(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.leases()
    rig.converge(rig.document())
    before = list(rig.knotc.zones[ZONE])
    records = section()["records"] + [{"name": "new", "type": "A", "value": "203.0.113.9"}]
    rig.knotc.refuse["new.lan.test. 300 A 203.0.113.9"] = "semantic check"
    with pytest.raises(StepError, match="semantic check"):
        rig.converge(rig.document(records=records))
    assert rig.knotc.zones[ZONE] == before
    assert not rig.knotc._open  # the transaction was aborted


def test_apply_and_rollback_through_the_engine(tmp_path: Path) -> None:
    knotc = FakeKnotc()
    daemons = KnotDaemons(tmp_path / "run", knotc)
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    engine = Engine(
        state, netlink_factory=lambda: kernel, files=FakeFiles(), runner=knotc, daemons=daemons
    )
    first = parse_document(base_document(routes=[], dns=section()))
    assert engine.apply_document(first).ok
    assert "router.lan.test. 300 A 203.0.113.1" in knotc.zones[ZONE]
    moved = section(records=[{"name": "router", "type": "A", "value": "203.0.113.2"}])
    second = parse_document(base_document(routes=[], dns=moved))
    assert engine.apply_document(second).ok
    assert "router.lan.test. 300 A 203.0.113.2" in knotc.zones[ZONE]
    assert "www.lan.test. 60 CNAME router.lan.test." not in knotc.zones[ZONE]
    assert engine.rollback_to(None, actor="test").ok
    assert "router.lan.test. 300 A 203.0.113.1" in knotc.zones[ZONE]
    assert "www.lan.test. 60 CNAME router.lan.test." in knotc.zones[ZONE]
    assert "router.lan.test. 300 A 203.0.113.2" not in knotc.zones[ZONE]
