"""The DHCP subsystem on fakes: section errors with paths, the compiled config, facts and plan, status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import DocumentError, parse_document
from trueup.model.health import SubsystemHealth
from trueup.subsystems.base import Scope
from trueup.subsystems.dhcp import DhcpSubsystem
from trueup.subsystems.dhcp.keaconfig import compile_config, has_ha
from trueup.subsystems.dhcp.section import DhcpSection
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink
from trueup.system.fence import hold_fence, lift_fence, read_fence
from trueup.system.kea import kea_paths
from trueup.system.sources import Sources

SUBNET = {"id": 7, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100 - 203.0.113.150"]}
HA = {
    "this-server": "a",
    "peers": [
        {"name": "a", "url": "http://192.0.2.1:8000/", "role": "primary"},
        {"name": "b", "url": "http://192.0.2.2:8000/", "role": "standby"},
    ],
}


def document(**dhcp: Any) -> Any:
    section: dict[str, Any] = {"interfaces": ["lan0"], "subnets": [SUBNET]}
    section.update(dhcp)
    return parse_document(base_document(dhcp=section))


def test_section_errors_name_the_path() -> None:
    with pytest.raises(DocumentError) as bad:
        document(subnets=[{"subnet": "203.0.113.0/24", "pools": ["198.51.100.1-198.51.100.9"]}])
    assert bad.value.problems == [
        "spec.dhcp.subnets[0].pools[0]: 198.51.100.1-198.51.100.9 is not inside 203.0.113.0/24"
    ]
    with pytest.raises(DocumentError) as bad:
        document(subnets=[SUBNET, {**SUBNET, "subnet": "192.0.2.0/24", "pools": []}])
    assert bad.value.problems == ["spec.dhcp.subnets[1].id: 7 is already used by subnets[0]"]
    with pytest.raises(DocumentError) as bad:
        document(ha={**HA, "this-server": "c"})
    assert "spec.dhcp.ha" in str(bad.value)


def test_every_subnet_problem_is_reported_at_its_full_path() -> None:
    outside = {
        "id": 1,
        "subnet": "203.0.113.0/24",
        "pools": ["203.0.113.10-203.0.113.20", "192.0.2.1-192.0.2.9"],
        "reservations": [{"hw-address": "02:00:00:00:00:aa", "ip-address": "198.51.100.20"}],
    }
    with pytest.raises(DocumentError) as bad:
        document(subnets=[outside])
    assert bad.value.problems == [
        "spec.dhcp.subnets[0].pools[1]: 192.0.2.1-192.0.2.9 is not inside 203.0.113.0/24",
        "spec.dhcp.subnets[0].reservations[0].ip-address: 198.51.100.20 is not inside "
        "203.0.113.0/24",
    ]


def test_overlapping_subnets_are_refused() -> None:
    inner = {"id": 2, "subnet": "203.0.113.128/25", "pools": ["203.0.113.200-203.0.113.210"]}
    with pytest.raises(DocumentError) as bad:
        document(subnets=[SUBNET, inner])
    assert bad.value.problems == [
        "spec.dhcp.subnets[1].subnet: 203.0.113.128/25 overlaps subnets[0] (203.0.113.0/24); "
        "an address must belong to one subnet"
    ]
    # Different families, or disjoint prefixes, are fine.
    v6 = {"id": 3, "subnet": "2001:db8:1::/64", "pools": ["2001:db8:1::100-2001:db8:1::1ff"]}
    other = {"id": 4, "subnet": "198.51.100.0/24", "pools": []}
    assert document(subnets=[SUBNET, v6, other]) is not None


def test_the_compiled_config_has_ha_only_when_the_document_does(tmp_path: Path) -> None:
    paths = kea_paths(tmp_path / "kea-dhcp4", 4)
    plain = document().spec.section("dhcp", DhcpSection)
    with_ha = document(ha=HA).spec.section("dhcp", DhcpSection)
    assert plain is not None and with_ha is not None
    config = compile_config(plain, 4, paths, ["lan0"])
    body = config["Dhcp4"]
    assert not has_ha(config) and has_ha(compile_config(with_ha, 4, paths, ["lan0"]))
    assert body["lease-database"] == {
        "type": "memfile",
        "name": str(paths.leases),
        "persist": True,
        "lfc-interval": 3600,
    }
    assert body["control-socket"]["socket-name"] == str(paths.socket)
    assert body["subnet4"][0]["pools"] == [{"pool": "203.0.113.100-203.0.113.150"}]
    assert body["interfaces-config"]["service-sockets-max-retries"] > 0


def sources(tmp_path: Path, links: dict[str, int] | None = None) -> Sources:
    return Sources(
        FakeNetlink(links if links is not None else {"lan0": 1500}),
        FakeFiles(),
        state_dir=tmp_path,
        daemons=FakeDaemons(tmp_path / "run"),
    )


def test_a_stopped_kea_is_started_and_a_removed_section_stops_it(tmp_path: Path) -> None:
    subsystem = DhcpSubsystem()
    desired = subsystem.desired(document(), Scope())
    assert desired["spec.dhcp.dhcp4.running"] is True
    assert desired["spec.dhcp.dhcp6.running"] is None
    observed = subsystem.observe(sources(tmp_path), Scope())
    plan = subsystem.plan(desired, observed, Scope())
    assert [s.action for s in plan.steps] == ["start"]
    # Kea runs, the document drops dhcp: stop it.
    gone = subsystem.desired(parse_document(base_document()), Scope())
    plan = subsystem.plan(gone, {"spec.dhcp.dhcp4.running": True}, Scope())
    assert [(s.action, s.args) for s in plan.steps] == [("stop", {"family": 4})]


def test_foreign_config_and_an_unfenced_allocator_plan_their_steps() -> None:
    subsystem = DhcpSubsystem()
    desired = subsystem.desired(document(), Scope())
    observed = dict(desired)
    assert subsystem.plan(desired, observed, Scope()).steps == []
    observed["spec.dhcp.dhcp4.config"] = "foreign:sha256:0"
    observed["spec.dhcp.dhcp4.allocation"] = "serving while fenced"
    plan = subsystem.plan(desired, observed, Scope())
    assert [s.action for s in plan.steps] == ["configure", "allocator"]
    observed = {**desired, "spec.dhcp.dhcp4.ha": True}
    assert [s.action for s in subsystem.plan(desired, observed, Scope()).steps] == ["configure"]


def test_a_plan_with_nothing_to_do_says_whether_dhcp_is_asked_for() -> None:
    subsystem = DhcpSubsystem()
    desired = subsystem.desired(document(), Scope())
    assert subsystem.plan(desired, dict(desired), Scope()).noop_reasons == [
        "Kea runs the document's configuration"
    ]
    none = subsystem.desired(parse_document(base_document()), Scope())
    assert subsystem.plan(none, {}, Scope()).noop_reasons == ["no DHCP is asked for"]


def test_fenced_and_pending_conditions(tmp_path: Path) -> None:
    subsystem = DhcpSubsystem()
    doc = document()
    assert subsystem.condition(sources(tmp_path), doc) is None
    waiting = subsystem.condition(sources(tmp_path, links={}), doc)
    assert waiting == (SubsystemHealth.PENDING, "waiting on link lan0")
    hold_fence(tmp_path, "dhcp", "restore", "full restore running")
    fenced = subsystem.condition(sources(tmp_path), doc)
    assert fenced == (SubsystemHealth.FENCED, "fenced by restore: full restore running")
    lifted = lift_fence(tmp_path, "dhcp")
    assert lifted is not None and lifted.owner == "restore"
    assert read_fence(tmp_path, "dhcp") is None


def test_a_damaged_fence_record_counts_as_held(tmp_path: Path) -> None:
    (tmp_path / "fences").mkdir()
    (tmp_path / "fences" / "dhcp.json").write_text("{not json")
    fence = read_fence(tmp_path, "dhcp")
    assert fence is not None and "damaged" in fence.reason


def test_kea_is_asked_once_per_piece_of_work_and_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trueup.subsystems.dhcp.subsystem as dhcp

    asked: list[str] = []

    def config_get(paths: Any, command: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        asked.append(command)
        return {"Dhcp4": {"n": len(asked)}}

    monkeypatch.setattr(dhcp, "kea_call", config_get)
    paths = kea_paths(tmp_path, 4)
    one = sources(tmp_path)
    first = dhcp._config_get(one, paths, 100)
    assert dhcp._config_get(one, paths, 100) == first  # the same piece of work: reused
    assert dhcp._config_get(one, paths, 101) != first  # another Kea process: asked again
    assert dhcp._config_get(sources(tmp_path), paths, 101)["Dhcp4"]["n"] == 3  # new work: asked
    assert dhcp._config_get(one, paths, None)["Dhcp4"]["n"] == 4  # no verified pid: never kept
    assert asked == ["config-get"] * 4


def test_cli_leases_without_dhcp_says_so_and_fails(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trueup.cli.dhcp import dhcp_app
    from trueup.journal.state import StateDir

    state = tmp_path / "state"
    StateDir(state).ensure()
    (state / "run" / "kea-dhcp6").mkdir(parents=True)  # an empty run directory is not DHCP
    result = CliRunner().invoke(dhcp_app, ["leases", "--state-dir", str(state)])
    assert result.exit_code == 1
    assert f"trueup dhcp leases: no DHCP in {state}: trueup never ran Kea here" in result.output
    assert "--state-dir" in result.output
    assert list((state / "run").iterdir()) == [state / "run" / "kea-dhcp6"]


def test_cli_leases_lists_expiry_in_utc(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trueup.cli.dhcp import dhcp_app
    from trueup.journal.state import StateDir

    StateDir(tmp_path).ensure()
    run = tmp_path / "run" / "kea-dhcp4"
    run.mkdir(parents=True)
    (run / "kea-leases4.csv").write_text(
        "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,"
        "hostname,state,user_context,pool_id\n"
        "203.0.113.100,02:00:00:00:00:01,,3600,1796055420,1,0,0,laptop,0,,0\n"
    )
    result = CliRunner().invoke(dhcp_app, ["leases", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "2026-11-30T16:17:00Z" in result.output
    assert "1 lease(s) from dhcp4: memfile" in result.output


def test_cli_fence_lift_with_no_fence_fails_and_changes_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trueup.cli.dhcp import dhcp_app
    from trueup.journal.state import StateDir

    StateDir(tmp_path).ensure()
    before = sorted(tmp_path.iterdir())
    result = CliRunner().invoke(dhcp_app, ["fence", "lift", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"no dhcp fence is held in {tmp_path}" in result.output
    assert "nothing was lifted" in result.output
    assert sorted(tmp_path.iterdir()) == before  # no audit line, no fence directory
    held = CliRunner().invoke(
        dhcp_app, ["fence", "hold", "--reason", "restore", "--state-dir", str(tmp_path)]
    )
    assert held.exit_code == 0
    assert f"no Kea runs from {tmp_path}" in held.output
    lifted = CliRunner().invoke(dhcp_app, ["fence", "lift", "--state-dir", str(tmp_path)])
    assert lifted.exit_code == 0 and "fence lifted (was held by" in lifted.output


def test_the_fence_class_is_added_removed_and_left_out_of_digests(tmp_path: Path) -> None:
    from trueup.subsystems.dhcp.keaconfig import (
        FENCE_CLASS,
        digest,
        has_fence,
        unfenced,
        with_fence,
    )

    section = document().spec.section("dhcp", DhcpSection)
    assert section is not None
    config = compile_config(section, 4, kea_paths(tmp_path, 4), ["lan0"])
    assert not has_fence(config) and "client-classes" not in config["Dhcp4"]
    fenced = with_fence(config, True)
    assert has_fence(fenced) and not has_fence(config)  # a copy: the original is unchanged
    assert fenced["Dhcp4"]["client-classes"] == [FENCE_CLASS]
    assert fenced["Dhcp4"]["client-classes"][0]["name"] == "DROP"  # Kea drops DROP's packets
    assert with_fence(fenced, True) == fenced  # never twice
    assert with_fence(fenced, False) == config
    assert digest(unfenced(fenced["Dhcp4"])) == digest(unfenced(config["Dhcp4"]))
    # As config-get answers: the class with Kea's defaults, beside a class of someone else's.
    other = {"name": "phones", "test": "substring(option[60].hex,0,4) == 'SIP/'"}
    served = {**fenced["Dhcp4"], "client-classes": [{**FENCE_CLASS, "next-server": "0.0.0.0"}]}
    served["client-classes"].append(other)
    assert has_fence({"Dhcp4": served})
    assert unfenced(served)["client-classes"] == [other]
    assert with_fence({"Dhcp4": served}, False)["Dhcp4"]["client-classes"] == [other]
    # A DROP class with another test is not trueup's fence.
    assert not has_fence({"Dhcp4": {"client-classes": [{"name": "DROP", "test": "member('x')"}]}})


def test_allocation_follows_the_fence_in_kea_s_configuration(tmp_path: Path) -> None:
    import os

    from trueup.subsystems.dhcp.allocator import CONSISTENT, allocation_state
    from trueup.subsystems.dhcp.keaconfig import with_fence

    paths = kea_paths(tmp_path / "kea-dhcp4", 4)
    plain: dict[str, Any] = {"Dhcp4": {"subnet4": []}}
    pid = os.getpid()
    assert allocation_state(paths, tmp_path, pid, plain) == CONSISTENT
    assert allocation_state(paths, tmp_path, pid, with_fence(plain, True)) == (
        "dropping without a fence"
    )
    hold_fence(tmp_path, "dhcp", "restore", "full restore running")
    assert allocation_state(paths, tmp_path, pid, plain) == "serving while fenced"
    # The class alone is not enough: dhcp-disable must be recorded for this very process.
    assert allocation_state(paths, tmp_path, pid, with_fence(plain, True)) == (
        "serving while fenced"
    )


def test_enforce_disables_first_when_holding_and_enables_last_when_lifting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import trueup.subsystems.dhcp.allocator as allocator
    from trueup.subsystems.dhcp.keaconfig import has_fence, with_fence

    kea: dict[str, Any] = {"config": {"Dhcp4": {"subnet4": []}}}
    calls: list[str] = []

    def kea_call(paths: Any, command: str, arguments: Any = None, **_: Any) -> dict[str, Any]:
        calls.append(command)
        if command == "config-get":
            return dict(kea["config"])
        if command == "config-set":
            kea["config"] = arguments
        return {}

    monkeypatch.setattr(allocator, "kea_call", kea_call)
    paths = kea_paths(tmp_path / "kea-dhcp4", 4)
    paths.run_dir.mkdir()
    pid = os.getpid()
    hold_fence(tmp_path, "dhcp", "restore", "full restore running")
    assert allocator.enforce(paths, tmp_path, pid) == "disabled"
    assert calls == [
        "status-get", "dhcp-disable", "config-get", "config-set", "config-write", "dhcp-disable"
    ]  # fmt: skip
    assert has_fence(kea["config"])
    assert allocator.allocation_state(paths, tmp_path, pid, kea["config"]) == "follows-fence"
    calls.clear()
    assert allocator.enforce(paths, tmp_path, pid) == "disabled"  # already fenced: no config-set
    assert calls == ["status-get", "dhcp-disable", "config-get", "dhcp-disable"]
    lift_fence(tmp_path, "dhcp")
    calls.clear()
    assert allocator.enforce(paths, tmp_path, pid) == "enabled"
    assert calls == ["status-get", "config-get", "config-set", "config-write", "dhcp-enable"]
    assert kea["config"] == with_fence({"Dhcp4": {"subnet4": []}}, False)


def test_kea_starts_from_a_fenced_file_while_the_fence_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import trueup.subsystems.dhcp.subsystem as dhcp
    from trueup.subsystems.dhcp.keaconfig import has_fence

    monkeypatch.setattr(dhcp, "make_socket_dir", lambda paths: None)
    section = document().spec.section("dhcp", DhcpSection)
    assert section is not None
    paths = kea_paths(tmp_path / "kea-dhcp4", 4)
    paths.run_dir.mkdir()
    config = compile_config(section, 4, paths, ["lan0"])
    spec = DhcpSubsystem()._spec(sources(tmp_path), paths, config)
    assert spec.before_start is not None
    spec.before_start()
    assert not has_fence(json.loads(paths.config.read_text()))
    hold_fence(tmp_path, "dhcp", "restore", "full restore running")
    spec.before_start()  # a restart after a crash: the fence is read at every start
    assert has_fence(json.loads(paths.config.read_text()))


def test_cli_leases_sort_addresses_by_value(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from trueup.cli.dhcp import dhcp_app
    from trueup.journal.state import StateDir

    StateDir(tmp_path).ensure()
    run = tmp_path / "run" / "kea-dhcp4"
    run.mkdir(parents=True)
    header = (
        "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,"
        "hostname,state,user_context,pool_id\n"
    )
    rows = "".join(
        f"203.0.113.{host},02:00:00:00:00:{host:02x},,3600,1796055420,1,0,0,h{host},0,,0\n"
        for host in (100, 20, 3)
    )
    (run / "kea-leases4.csv").write_text(header + rows)
    result = CliRunner().invoke(dhcp_app, ["leases", "--state-dir", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    addresses = [lease["address"] for lease in json.loads(result.output)["leases"]]
    assert addresses == ["203.0.113.3", "203.0.113.20", "203.0.113.100"]
