"""What subsystems need on the machine, and how each need is checked, at the system/ seam."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.routers import base_document
from trueup.model.document import parse_document
from trueup.startup.preflight import preflight
from trueup.subsystems.dhcp import DhcpSubsystem
from trueup.subsystems.dns import DnsSubsystem
from trueup.subsystems.firewall import FirewallSubsystem
from trueup.subsystems.ha import HaSubsystem
from trueup.subsystems.proxy import ProxySubsystem
from trueup.subsystems.registry import default_subsystems
from trueup.system.fake import FakeRunner
from trueup.system.kea import HA_HOOK, LEASE_CMDS_HOOK
from trueup.system.requirements import binary, check, directory, library, regular_file
from trueup.system.runner import Completed
from trueup.system.wireguard import kernel_has_wireguard, requirements

KEA = "/usr/sbin/kea-dhcp4"
SUBNET4 = {"id": 1, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100-203.0.113.150"]}
SUBNET6 = {"id": 2, "subnet": "2001:db8:1::/64", "pools": ["2001:db8:1::100-2001:db8:1::1ff"]}
DHCP_HA = {
    "this-server": "a",
    "peers": [
        {"name": "a", "url": "http://192.0.2.1:8000/", "role": "primary"},
        {"name": "b", "url": "http://192.0.2.2:8000/", "role": "standby"},
    ],
}
VIPS = [{"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.254/24"]}]


def _which(found: dict[str, str]) -> Any:
    return found.get


def _elf(path: Path, e_type: int) -> Path:
    # 64-bit little-endian ELF identification, then e_type at offset 16.
    path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + e_type.to_bytes(2, "little") + b"\0" * 46)
    return path


def _names(needs: list[Any]) -> list[str]:
    return [need.name for need in needs]


# -- checks -----------------------------------------------------------------------


def test_a_missing_binary_names_itself_and_its_package() -> None:
    runner = FakeRunner()
    result = check(binary("keepalived", "keepalived", ("-v",)), runner, which=_which({}))
    assert not result.ok
    assert result.message == "keepalived not found on PATH"
    assert result.remedy == "install the Debian package keepalived"
    assert runner.calls == []


def test_a_binary_is_run_in_its_harmless_mode() -> None:
    runner = FakeRunner({(KEA, "-v"): Completed((KEA, "-v"), 0, "2.2.0\n", "")})
    result = check(
        binary("kea-dhcp4", "kea-dhcp4-server", ("-v",)),
        runner,
        which=_which({"kea-dhcp4": KEA}),
    )
    assert result.ok and result.path == KEA
    assert result.message == f"kea-dhcp4 at {KEA} runs (2.2.0)"
    assert runner.calls == [(KEA, "-v")]


def test_a_binary_that_exits_non_zero_or_hangs_is_unmet() -> None:
    need = binary("kea-dhcp4", "kea-dhcp4-server", ("-v",))
    where = _which({"kea-dhcp4": KEA})
    failing = FakeRunner(
        {(KEA, "-v"): Completed((KEA, "-v"), 1, "", "error while loading libkea-dhcpsrv.so\n")}
    )
    result = check(need, failing, which=where)
    assert not result.ok and result.path == KEA
    assert result.message == (
        f"{KEA} is present but cannot run: `{KEA} -v` exited 1: "
        "error while loading libkea-dhcpsrv.so"
    )
    assert result.remedy == "reinstall the Debian package kea-dhcp4-server"
    hanging = FakeRunner({(KEA, "-v"): Completed((KEA, "-v"), 124, "", "timed out")})
    result = check(need, hanging, which=where, timeout=3)
    assert not result.ok and "did not finish within 3 s" in result.message


def test_a_binary_declared_without_a_probe_is_only_looked_up() -> None:
    runner = FakeRunner()
    result = check(binary("tool", "", probe=()), runner, which=_which({"tool": "/usr/bin/tool"}))
    assert result.ok and runner.calls == []
    missing = check(binary("tool", "", probe=()), runner, which=_which({}))
    assert missing.remedy == "install the package that provides it"


def test_a_hook_library_must_be_a_readable_elf_shared_object(tmp_path: Path) -> None:
    runner = FakeRunner()

    def verdict(path: Path) -> tuple[bool, str]:
        result = check(library(path, "kea-common"), runner)
        return result.ok, result.message

    assert verdict(_elf(tmp_path / "good.so", 3)) == (True, f"{tmp_path / 'good.so'} present")
    assert verdict(tmp_path / "gone.so") == (False, f"{tmp_path / 'gone.so'} missing")
    (tmp_path / "dir.so").mkdir()
    assert verdict(tmp_path / "dir.so") == (False, f"{tmp_path / 'dir.so'} is not a regular file")
    (tmp_path / "text.so").write_text("not a library")
    assert verdict(tmp_path / "text.so") == (
        False,
        f"{tmp_path / 'text.so'} is not an ELF shared object",
    )
    (tmp_path / "empty.so").write_bytes(b"")
    assert not verdict(tmp_path / "empty.so")[0]
    assert verdict(_elf(tmp_path / "exec.so", 2)) == (
        False,
        f"{tmp_path / 'exec.so'} is an ELF file but not a shared object",
    )
    (tmp_path / "link.so").symlink_to(tmp_path / "good.so")
    assert verdict(tmp_path / "link.so")[0]  # the loader follows symlinks too
    assert check(library(tmp_path / "gone.so", "kea-common"), runner).remedy == (
        "install the Debian package kea-common"
    )


def test_files_and_directories(tmp_path: Path) -> None:
    runner = FakeRunner()
    (tmp_path / "conf").write_text("x")
    assert check(regular_file(tmp_path / "conf", "p"), runner).ok
    assert not check(regular_file(tmp_path, "p"), runner).ok
    assert check(directory(tmp_path, "p"), runner).ok
    result = check(directory(tmp_path / "conf", "p"), runner)
    assert not result.ok and result.message.endswith("is not a directory")


# -- what each subsystem declares --------------------------------------------------


def test_dhcp_needs_kea_per_family_and_the_ha_hook_only_with_ha() -> None:
    dhcp = DhcpSubsystem()
    plain = parse_document(base_document(dhcp={"interfaces": ["lan0"], "subnets": [SUBNET4]}))
    assert _names(dhcp.requirements(plain)) == ["kea-dhcp4", str(LEASE_CMDS_HOOK)]
    both = parse_document(
        base_document(dhcp={"interfaces": ["lan0"], "subnets": [SUBNET4, SUBNET6], "ha": DHCP_HA})
    )
    needs = dhcp.requirements(both)
    assert set(_names(needs)) == {"kea-dhcp4", "kea-dhcp6", str(LEASE_CMDS_HOOK), str(HA_HOOK)}
    packages = {need.name: need.package for need in needs}
    assert packages["kea-dhcp6"] == "kea-dhcp6-server"
    assert packages[str(HA_HOOK)] == "kea-common"
    assert all(need.probe == ("-v",) for need in needs if need.kind == "binary")
    assert dhcp.requirements(parse_document(base_document())) == []


def test_ha_needs_keepalived_only_for_a_role_that_holds_addresses() -> None:
    ha = HaSubsystem()
    primary = parse_document(base_document(ha={"role": "primary", "vips": VIPS}))
    (need,) = ha.requirements(primary)
    assert (need.kind, need.name, need.package, need.probe) == (
        "binary",
        "keepalived",
        "keepalived",
        ("-v",),
    )
    assert ha.requirements(parse_document(base_document(ha={"role": "none", "vips": VIPS}))) == []


def test_dns_proxy_and_firewall_declare_their_programs() -> None:
    document = parse_document(base_document())
    assert _names(DnsSubsystem().requirements(document)) == ["knotd", "knotc"]
    assert _names(FirewallSubsystem().requirements(document)) == ["nft", "unshare"]
    assert ProxySubsystem().requirements(document) == []
    with_proxy = parse_document(
        base_document(
            proxies=[
                {
                    "name": "web",
                    "bind": "203.0.113.1:8080",
                    "mode": "http",
                    "backend": {"servers": [{"name": "a", "address": "203.0.113.10:8080"}]},
                }
            ]
        )
    )
    assert _names(ProxySubsystem().requirements(with_proxy)) == ["haproxy"]


def test_wireguard_go_is_needed_only_without_kernel_wireguard(tmp_path: Path) -> None:
    assert _names(requirements(kernel_wireguard=True)) == ["wg"]
    assert _names(requirements(kernel_wireguard=False)) == ["wg", "wireguard-go"]
    sys_module, modules = tmp_path / "sys", tmp_path / "lib"
    sys_module.mkdir()
    release = modules / os.uname().release
    release.mkdir(parents=True)
    assert not kernel_has_wireguard(sys_module, modules)
    (release / "modules.dep").write_text("kernel/drivers/net/wireguard/wireguard.ko.xz: x.ko\n")
    assert kernel_has_wireguard(sys_module, modules)
    (release / "modules.dep").unlink()
    (sys_module / "wireguard").mkdir()
    assert kernel_has_wireguard(sys_module, modules)


# -- preflight ---------------------------------------------------------------------


def test_preflight_checks_the_config_documents_needs_and_names_them(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    config = tmp_path / "new.json"
    config.write_text(json.dumps(base_document(ha={"role": "primary", "vips": VIPS})))
    runner = FakeRunner()  # every probe "exits 127": each binary is then a blocker
    findings = preflight(state_dir, default_subsystems(), config=config, runner=runner)
    ha = [f for f in findings if f.subsystem == "ha"]
    assert [f.severity for f in ha] == ["blocker"]
    assert ha[0].check == "ha prerequisites"
    assert "keepalived" in ha[0].message and "(needed by ha)" in ha[0].message
    assert ha[0].message.endswith("the Debian package keepalived")
    assert ha[0].to_json()["requirement"]["package"] == "keepalived"
    assert any(f.check == "requirements" and str(config) in f.message for f in findings)
    # Only configured subsystems are asked: no DHCP, DNS or proxy in this document.
    assert not {f.subsystem for f in findings} & {"dhcp", "dns", "proxy"}
    # The JSON keeps its shape: severity, check and message on every finding.
    assert all({"severity", "check", "message"} <= set(f.to_json()) for f in findings)
