"""The HA subsystem on fakes: section paths, the compiled keepalived.conf, facts, plan, steps, scope."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import DocumentError, parse_document
from trueup.subsystems.addresses import AddressesSubsystem
from trueup.subsystems.base import Scope, StepError
from trueup.subsystems.ha.subsystem import HaSubsystem, compile_config
from trueup.subsystems.management import ManagementSubsystem
from trueup.subsystems.registry import scope_for
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink, FakeRunner
from trueup.system.keepalived import keepalived_paths
from trueup.system.runner import Completed
from trueup.system.sources import Sources

VIP = "203.0.113.254/24"


def ha(**extra: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "role": "primary",
        "vips": [{"interface": "lan0", "vrid": 51, "addresses": [VIP]}],
    }
    section.update(extra)
    return section


def document(spec_extra: dict[str, Any] | None = None, **section: Any) -> Any:
    doc = base_document(ha=ha(**section))
    doc["spec"].update(spec_extra or {})
    return parse_document(doc)


def problems(spec_extra: dict[str, Any] | None = None, **section: Any) -> list[str]:
    with pytest.raises(DocumentError) as bad:
        document(spec_extra, **section)
    return bad.value.problems


def test_section_errors_name_the_path() -> None:
    assert problems(role="leader")[0].startswith("spec.ha.role: ")
    assert problems(priority=255)[0].startswith("spec.ha.priority: ")
    assert problems(advert_interval=0.005)[0].startswith("spec.ha.advert_interval: ")
    twice = [
        {"interface": "lan0", "vrid": 51, "addresses": [VIP]},
        {"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.253/24"]},
    ]
    assert problems(vips=twice) == ["spec.ha.vips[1].vrid: 51 is already used on lan0 by vips[0]"]
    bad_vip = [{"interface": "lan0", "vrid": 0, "addresses": ["203.0.113.254"]}]
    found = problems(vips=bad_vip)
    assert any(p.startswith("spec.ha.vips[0].vrid: ") for p in found)
    assert any(p.startswith("spec.ha.vips[0].addresses[0]: not an IPv4/IPv6 prefix") for p in found)
    assert problems(peers=["2001:db8::2"]) == [
        "spec.ha.peers: IPv4 virtual addresses but no IPv4 peer; unicast VRRP needs a peer "
        "of each family (or no peers: multicast)"
    ]


def test_cross_section_errors_name_the_path() -> None:
    elsewhere = [{"interface": "wan9", "vrid": 1, "addresses": [VIP]}]
    assert problems(vips=elsewhere) == [
        "spec.ha.vips[0].interface: wan9 is not a managed interface "
        "(name it in spec.interfaces or spec.management)"
    ]
    # A VIP on the management interface is allowed; one that is the management address is not.
    on_mgmt = [{"interface": "mgmt0", "vrid": 7, "addresses": ["198.51.100.9/24"]}]
    assert document(vips=on_mgmt) is not None
    clash = [{"interface": "mgmt0", "vrid": 7, "addresses": ["198.51.100.2/24"]}]
    assert problems(vips=clash)[0].startswith(
        "spec.management.addresses[0]: 198.51.100.2 is an HA virtual address "
        "(spec.ha.vips[0].addresses[0])"
    )
    lan = [{"interface": "lan0", "vrid": 7, "addresses": ["203.0.113.1/24"]}]
    assert problems(vips=lan)[0].startswith(
        "spec.ha.vips[0].addresses[0]: 203.0.113.1 is also spec.interfaces[0].addresses[0]"
    )
    management = {
        "interface": "mgmt0",
        "addresses": ["198.51.100.2/24"],
        "api": {"bind": "203.0.113.254"},
    }
    assert problems({"management": management})[0].startswith(
        "spec.management.api.bind: 203.0.113.254 is an HA virtual address"
    )


def test_dhcp_ha_role_must_follow_the_ha_role() -> None:
    kea = {
        "interfaces": ["lan0"],
        "subnets": [{"id": 1, "subnet": "203.0.113.0/24", "pools": []}],
        "ha": {
            "this-server": "a",
            "peers": [
                {"name": "a", "url": "http://192.0.2.1:8000/", "role": "primary"},
                {"name": "b", "url": "http://192.0.2.2:8000/", "role": "standby"},
            ],
        },
    }
    assert document({"dhcp": kea}, role="primary") is not None
    assert problems({"dhcp": kea}, role="standby") == [
        "spec.dhcp.ha.peers[0].role: this server (a) is the Kea HA primary but spec.ha.role "
        "is standby; DHCP's HA role must follow it (Kea HA peer role backup or secondary "
        "or standby)"
    ]


def test_the_compiled_configuration() -> None:
    doc = document(
        advert_interval=0.5,
        peers=["192.0.2.3", "2001:db8::3"],
        vips=[{"interface": "lan0", "vrid": 51, "addresses": [VIP, "2001:db8:1::fe/64"]}],
    )
    text = compile_config(doc)
    assert text is not None
    assert "router_id trueup-edge-01" in text
    assert "vrrp_garp_master_delay 1" in text and "vrrp_garp_master_repeat 3" in text
    assert "vrrp_instance trueup_lan0_51_v4 {" in text
    assert "vrrp_instance trueup_lan0_51_v6 {" in text
    assert "  state MASTER" in text and "priority 200" in text and "advert_int 0.5" in text
    assert "    203.0.113.254/24 dev lan0" in text and "    2001:db8:1::fe/64 dev lan0" in text
    v4 = text.split("vrrp_instance trueup_lan0_51_v4")[1].split("vrrp_instance")[0]
    assert "192.0.2.3" in v4 and "2001:db8::3" not in v4
    assert "notify" not in text and "script" not in text
    standby = compile_config(document(role="standby", preempt=False))
    assert standby is not None
    assert "state BACKUP" in standby and "priority 100" in standby and "nopreempt" in standby
    assert "unicast_peer" not in standby
    assert compile_config(document(role="standby", priority=150)) is not None
    assert "priority 150" in str(compile_config(document(role="standby", priority=150)))
    assert compile_config(document(role="none")) is None


def sources(tmp_path: Path, runner: FakeRunner | None = None) -> Sources:
    return Sources(
        FakeNetlink({"lan0": 1500, "mgmt0": 1500}),
        FakeFiles(),
        runner=runner or FakeRunner(),
        state_dir=tmp_path,
        daemons=FakeDaemons(tmp_path / "run"),
    )


def config_ok(src: Sources) -> FakeRunner:
    runner = src.runner
    assert isinstance(runner, FakeRunner)
    paths = keepalived_paths(src.daemons.run_dir("keepalived"))
    argv = tuple(paths.test_argv(paths.run_dir / "keepalived.conf.check"))
    runner.answers[argv] = Completed(argv, 0, "", "")
    return runner


def converge(sub: HaSubsystem, src: Sources, doc: Any, scope: Scope) -> list[str]:
    plan = sub.plan(sub.desired(doc, scope), sub.observe(src, scope), scope)
    for step in plan.steps:
        sub.execute(src, step)
    return [s.action for s in plan.steps]


def test_start_then_in_sync_then_a_hand_edit_is_healed_by_reload(tmp_path: Path) -> None:
    sub, src = HaSubsystem(), sources(tmp_path)
    config_ok(src)
    doc = document()
    scope = scope_for(doc)
    assert converge(sub, src, doc, scope) == ["start"]
    paths = keepalived_paths(src.daemons.run_dir("keepalived"))
    assert paths.config.read_text() == compile_config(doc)
    assert paths.config.stat().st_mode & 0o777 == 0o600
    assert converge(sub, src, doc, scope) == []
    # VIP presence is the role's runtime state, never drift.
    src.netlink.add_address("lan0", VIP)
    assert converge(sub, src, doc, scope) == []
    paths.config.write_text(paths.config.read_text().replace("priority 200", "priority 10"))
    diff = sub.diff(sub.desired(doc, scope), sub.observe(src, scope))
    assert [d.path for d in diff] == ["spec.ha.config"]
    assert converge(sub, src, doc, scope) == ["configure"]
    assert "priority 200" in paths.config.read_text()
    assert isinstance(src.daemons, FakeDaemons)
    assert (f"signal:{int(signal.SIGHUP)}", "keepalived") in src.daemons.events


def test_a_refused_configuration_fails_the_step_and_keeps_the_running_one(
    tmp_path: Path,
) -> None:
    sub, src = HaSubsystem(), sources(tmp_path)
    doc = document()
    scope = scope_for(doc)
    plan = sub.plan(sub.desired(doc, scope), sub.observe(src, scope), scope)
    with pytest.raises(StepError, match="keepalived refused the configuration"):
        sub.execute(src, plan.steps[0])
    assert not keepalived_paths(src.daemons.run_dir("keepalived")).config.exists()
    assert not src.daemons.running("keepalived")


def test_stale_vips_are_released_and_reported_when_keepalived_does_not_run(
    tmp_path: Path,
) -> None:
    sub, src = HaSubsystem(), sources(tmp_path)
    config_ok(src)
    doc = document()
    scope = scope_for(doc)
    src.netlink.add_address("lan0", "203.0.113.1/24")
    src.netlink.add_address("lan0", VIP)  # left by a killed keepalived
    observed = sub.observe(src, scope)
    assert observed["spec.ha.unheld"] == [f"lan0 {VIP}"]
    assert converge(sub, src, doc, scope) == ["release", "start"]
    assert [a.prefix for a in src.netlink.addresses()] == ["203.0.113.1/24"]
    report = sub.report(src, scope)
    assert [(r["interface"], r["address"]) for r in report["released"]] == [("lan0", VIP)]
    assert report["released"][0]["reason"] == "keepalived not running"
    assert report["state"] == "BACKUP" and report["keepalived"]["running"] is True


def test_role_none_stops_keepalived_and_releases_every_vip(tmp_path: Path) -> None:
    sub, src = HaSubsystem(), sources(tmp_path)
    config_ok(src)
    doc = document()
    converge(sub, src, doc, scope_for(doc))
    src.netlink.add_address("lan0", VIP)
    none = document(role="none")
    scope = scope_for(none, doc)
    assert converge(sub, src, none, scope) == ["stop", "release"]
    assert src.netlink.addresses() == []
    assert not src.daemons.running("keepalived")
    # A VIP of the previous revision that shows up later is released too.
    dropped = parse_document(base_document())
    src.netlink.add_address("lan0", VIP)
    assert converge(sub, src, dropped, scope_for(dropped, doc)) == ["release"]
    assert src.netlink.addresses() == []


def test_report_shows_state_priority_and_held_vips(tmp_path: Path) -> None:
    sub, src = HaSubsystem(), sources(tmp_path)
    config_ok(src)
    doc = document()
    scope = scope_for(doc)
    converge(sub, src, doc, scope)
    assert sub.report(src, scope)["state"] == "BACKUP"
    src.netlink.add_address("lan0", VIP)
    report = sub.report(src, scope)
    assert report["state"] == "MASTER" and report["priority"] == 200
    assert report["holds"] == [f"lan0 {VIP}"]


def test_addresses_and_management_never_see_a_vip(tmp_path: Path) -> None:
    doc = document(
        vips=[
            {"interface": "lan0", "vrid": 51, "addresses": [VIP]},
            {"interface": "mgmt0", "vrid": 52, "addresses": ["198.51.100.9/24"]},
        ]
    )
    scope = scope_for(doc)
    assert scope.virtual_addresses == frozenset({VIP, "198.51.100.9/24"})
    src = sources(tmp_path)
    for ifname, prefix in [
        ("lan0", "203.0.113.1/24"),
        ("lan0", "2001:db8:1::1/64"),
        ("lan0", VIP),
        ("mgmt0", "198.51.100.2/24"),
        ("mgmt0", "198.51.100.9/24"),
    ]:
        src.netlink.add_address(ifname, prefix)
    addresses, management = AddressesSubsystem(), ManagementSubsystem()
    plan = addresses.plan(addresses.desired(doc, scope), addresses.observe(src, scope), scope)
    assert plan.steps == []
    observed = management.observe(src, scope)
    assert observed["spec.management.addresses"] == ["198.51.100.2/24"]
    mplan = management.plan(management.desired(doc, scope), observed, scope)
    assert not [s for s in mplan.steps if s.action == "del-address"]
    # Without the HA section the VIP is foreign drift again (the addresses subsystem owns lan0).
    plain = parse_document(base_document())
    plain_scope = scope_for(plain)
    steps = addresses.plan(
        addresses.desired(plain, plain_scope), addresses.observe(src, plain_scope), plain_scope
    ).steps
    assert [(s.action, s.args["prefix"]) for s in steps] == [("del-address", VIP)]
    # ... unless the previous revision named it: the HA subsystem releases it, not addresses.
    released_scope = scope_for(plain, doc)
    assert (
        addresses.plan(
            addresses.desired(plain, released_scope),
            addresses.observe(src, released_scope),
            released_scope,
        ).steps
        == []
    )


def test_scope_serialises_virtual_addresses_and_old_journals_load() -> None:
    scope = scope_for(document())
    again = Scope.from_json(scope.to_json())
    assert again == scope and again.virtual_addresses == frozenset({VIP})
    old = scope.to_json()
    del old["virtual_addresses"]
    assert Scope.from_json(old).virtual_addresses == frozenset()
    assert Scope().is_virtual(VIP) is False and scope.is_virtual("203.0.113.254/32")


class KeepalivedRunner(FakeRunner):
    """Answers every `keepalived --config-test`: accepted."""

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        if argv[:2] == ["keepalived", "--config-test"]:
            self.calls.append(tuple(argv))
            return Completed(tuple(argv), 0, "", "")
        return super().run(argv, input=input, timeout=timeout)


def kea_ha(role_a: str, role_b: str) -> dict[str, Any]:
    return {
        "interfaces": ["lan0"],
        "subnets": [
            {"id": 1, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100-203.0.113.150"]}
        ],
        "ha": {
            "this-server": "a",
            "peers": [
                {"name": "a", "url": "http://192.0.2.1:8000/", "role": role_a},
                {"name": "b", "url": "http://192.0.2.2:8000/", "role": role_b},
            ],
        },
    }


def test_a_role_change_never_activates_a_fenced_allocator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import trueup.subsystems.dhcp.allocator as allocator
    import trueup.subsystems.dhcp.subsystem as dhcp
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.system.fence import hold_fence, read_fence

    commands: list[str] = []
    running: dict[str, Any] = {}

    def kea_call(paths: Any, command: str, arguments: Any = None, timeout: float = 10.0) -> Any:
        commands.append(command)
        if command == "config-get":
            if not running:
                running.update(json.loads(paths.config.read_text()))
            return dict(running)
        if command == "config-set":
            running.clear()
            running.update(arguments)
        if command == "config-write":
            Path(arguments["filename"]).write_text(json.dumps(running))
        return {}

    for module in (dhcp, allocator):
        monkeypatch.setattr(module, "kea_call", kea_call)
    monkeypatch.setattr(dhcp, "wait_for_socket", lambda paths, timeout=15.0, pid=None: None)
    monkeypatch.setattr(allocator, "wait_for_socket", lambda paths, timeout=15.0, pid=None: None)
    state = StateDir(tmp_path / "state")
    state.ensure()
    daemons = FakeDaemons(tmp_path / "run")
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    engine = Engine(
        state,
        netlink_factory=lambda: kernel,
        files=FakeFiles(),
        runner=KeepalivedRunner(),
        daemons=daemons,
    )
    # A restore holds the DHCP fence: Kea must not allocate, whatever happens to the role.
    hold_fence(state.root, "dhcp", "restore", "full restore running")
    primary = parse_document(
        base_document(routes=[], dhcp=kea_ha("primary", "standby"), ha=ha(role="primary"))
    )
    assert engine.apply_document(primary).ok
    standby = parse_document(
        base_document(routes=[], dhcp=kea_ha("standby", "primary"), ha=ha(role="standby"))
    )
    result = engine.apply_document(standby)
    assert result.ok, result
    assert "dhcp-enable" not in commands
    assert commands.count("dhcp-disable") >= 2  # at start, and again after the reconfiguration
    assert commands.index("config-set") < len(commands) - 1 - commands[::-1].index("dhcp-disable")
    assert read_fence(state.root, "dhcp") is not None
    keepalived = keepalived_paths(daemons.run_dir("keepalived"))
    assert "priority 100" in keepalived.config.read_text()
    assert (f"signal:{int(signal.SIGHUP)}", "keepalived") in daemons.events


def test_management_json_records_vips_and_a_saved_bind_on_one_serves_the_wildcard(
    tmp_path: Path,
) -> None:
    from trueup.journal.management import (
        api_bind_address,
        management_facts,
        read_management,
        write_management,
    )

    mgmt = {"interface": "mgmt0", "addresses": ["198.51.100.2/24"], "api": {"bind": "198.51.100.9"}}
    old = management_facts(mgmt, version=1, digest=None)
    write_management(tmp_path, old)
    # A record written before virtual addresses existed still verifies, and binds as saved.
    saved = read_management(tmp_path)
    assert saved is not None and "virtual" not in saved
    assert api_bind_address(saved) == "198.51.100.9"
    facts = management_facts(mgmt, version=2, digest=None, virtual=["198.51.100.9/24"])
    write_management(tmp_path, facts)
    saved = read_management(tmp_path)
    assert saved is not None and saved["virtual"] == ["198.51.100.9"]
    assert api_bind_address(saved) is None
    # The checksum covers it: a garbled list is not trusted.
    path = tmp_path / "management.json"
    path.write_text(path.read_text().replace('198.51.100.9"\n', '198.51.100.8"\n'))
    assert read_management(tmp_path) is None


def test_the_guard_tells_a_management_address_that_becomes_a_vip_apart() -> None:
    from trueup.reconcile.guard import unsafe_management_changes

    before = base_document()
    before["spec"]["management"]["addresses"] = ["198.51.100.2/24", "198.51.100.9/24"]
    after = base_document(
        ha=ha(vips=[{"interface": "mgmt0", "vrid": 9, "addresses": ["198.51.100.9/24"]}])
    )
    found = unsafe_management_changes(parse_document(before), parse_document(after))
    assert found == [
        "removes management address 198.51.100.9/24 from mgmt0 (it becomes an HA virtual "
        "address, held only while this node's role holds it)"
    ]


def test_a_release_on_a_worker_is_verified_against_the_kernel_not_a_stale_cache(
    tmp_path: Path,
) -> None:
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine

    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    engine = Engine(
        state,
        netlink_factory=lambda: kernel,
        files=FakeFiles(),
        runner=KeepalivedRunner(),
        daemons=FakeDaemons(tmp_path / "run"),
    )
    none = parse_document(base_document(routes=[], ha=ha(role="none")))
    assert engine.apply_document(none).ok
    kernel.add_address("lan0", VIP)  # a crashed holder's leftover
    result = engine.apply_document(none.with_version(2))
    assert result.ok, result
    assert VIP not in [a.prefix for a in kernel.addresses()]


def test_phase_one_never_binds_a_saved_bind_that_is_a_vip() -> None:
    from trueup.reconcile.management_tier import document_from_facts

    facts = {
        "interface": "mgmt0",
        "addresses": ["198.51.100.2/24"],
        "gateway": None,
        "api": {"port": 7443, "bind": "198.51.100.9"},
        "virtual": ["198.51.100.9"],
    }
    assert document_from_facts(facts, source="test").spec.api_bind_address() is None
    kept = {**facts, "virtual": ["198.51.100.10"]}
    assert document_from_facts(kept, source="test").spec.api_bind_address() == "198.51.100.9"


def test_an_interface_name_with_a_trailing_newline_never_reaches_keepalived_conf() -> None:
    found = problems(vips=[{"interface": "lan0\n", "vrid": 51, "addresses": [VIP]}])
    assert any("spec.ha.vips[0].interface" in p and "not an interface name" in p for p in found), (
        found
    )
