"""The Debian package's life on a fresh bookworm root booted with systemd (podman, PID 1):
install → the unit reaches READY (Type=notify) and the agent applies the document; the agent
restarted and stopped leaves its Kea serving and the next agent adopts it (KillMode=process);
an upgrade whose new agent cannot boot fails its preflight and leaves the old agent running; a
good upgrade replaces it, keeps the state and the same Kea; a document needing a program the
machine lacks fails the package's preflight; removal stops the daemons and keeps state and
configuration, purge deletes them. The steps run in order on one container.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packaging.debian import (
    UNIT,
    V1,
    V2,
    V3,
    DebianRoot,
    build_packages,
    debian_root,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.timeout(1500)]

DOCUMENT = """apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-deb}
spec:
  management: {interface: mgmt0, addresses: ["198.51.100.2/24"], gateway: 198.51.100.1}
  interfaces:
    - {name: lan0, addresses: ["203.0.113.1/24"]}
"""
DHCP = """  dhcp:
    interfaces: [lan0]
    subnets:
      - {id: 1, subnet: 203.0.113.0/24, pools: ["POOL"]}
"""
POOL, OTHER_POOL = "203.0.113.100-203.0.113.150", "203.0.113.160-203.0.113.199"
HA = """  ha:
    role: primary
    vips: [{interface: lan0, vrid: 51, addresses: ["203.0.113.254/24"]}]
"""
KEA_RUN = "/var/lib/trueup/run/kea-dhcp4"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    debs = build_packages(tmp_path_factory.mktemp("debs"))
    yield from debian_root(debs)


def _watchdog_ping(root: DebianRoot) -> int:
    out = root.run("systemctl", "show", UNIT, "-p", "WatchdogTimestampMonotonic").stdout
    return int(out.strip().split("=", 1)[1] or 0)


def _applied(root: DebianRoot) -> dict[str, object]:
    return dict(json.loads(root.read("/var/lib/trueup/applied.json")))


def _write_document(root: DebianRoot, text: str) -> None:
    root.run("sh", "-c", f"cat > /etc/trueup/desired.yaml <<'EOF'\n{text}EOF")


def _kea_pid(root: DebianRoot) -> int | None:
    """The pid of the Kea the agent started (its pid record), when that process runs Kea."""
    record = root.run("cat", f"{KEA_RUN}/kea-dhcp4.pid", check=False)
    if record.returncode != 0:
        return None
    pid = int(json.loads(record.stdout)["pid"])
    cmdline = root.run("cat", f"/proc/{pid}/cmdline", check=False).stdout
    return pid if f"{KEA_RUN}/kea-dhcp4.conf" in cmdline and not _zombie(root, pid) else None


def _zombie(root: DebianRoot, pid: int) -> bool:
    state = root.run("sh", "-c", f"cut -d' ' -f3 /proc/{pid}/stat", check=False).stdout.strip()
    return state in ("Z", "")


def _dhcp_health(root: DebianRoot) -> str:
    result = root.run("trueup", "status", "-o", "json", check=False)
    if result.returncode != 0:
        return ""
    return str(json.loads(result.stdout)["subsystems"].get("dhcp", {}).get("health", ""))


def _logged_by(root: DebianRoot, pid: str, text: str) -> bool:
    return text in root.run("journalctl", "-o", "cat", f"_PID={pid}", check=False).stdout


def test_install_without_a_document_enables_the_unit_but_leaves_it_waiting(
    root: DebianRoot,
) -> None:
    result = root.run("dpkg", "-i", root.deb(V1))
    assert "write /etc/trueup/desired.yaml" in result.stdout
    unit = root.unit()
    assert unit["ActiveState"] == "inactive" and unit["ConditionResult"] == "no", unit
    assert root.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    assert root.current() == f"releases/{V1}"
    assert root.run("stat", "-c", "%a %U", "/var/lib/trueup").stdout.split() == ["700", "root"]
    assert root.run("stat", "-c", "%a %U", "/etc/trueup").stdout.split() == ["750", "root"]
    assert root.versions().startswith(f"trueup {V1}")


def test_the_agent_starts_under_systemd_and_applies_the_document(root: DebianRoot) -> None:
    # The router's links: management and LAN, veth pairs with their peers up.
    for link in ("mgmt0", "lan0"):
        root.run("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        root.run("ip", "link", "set", f"{link}p", "up")
    root.run("sh", "-c", f"cat > /etc/trueup/desired.yaml <<'EOF'\n{DOCUMENT}EOF")
    # Type=notify: `systemctl start` returns once the agent sent READY=1.
    root.run("systemctl", "start", UNIT)
    unit = root.unit()
    assert (unit["ActiveState"], unit["SubState"], unit["Type"]) == ("active", "running", "notify")
    assert unit["WatchdogUSec"] == "30s"
    assert f"agent {V1} (pid {unit['MainPID']}" in root.versions()
    wait_for("the document applied", lambda: root.exists("/var/lib/trueup/applied.json"))
    assert int(str(_applied(root)["version"])) >= 1
    addresses = root.run("ip", "-br", "addr", "show", "dev", "mgmt0").stdout
    assert "198.51.100.2/24" in addresses
    wait_for(
        "lan0's address",
        lambda: "203.0.113.1/24" in root.run("ip", "-br", "addr", "show", "dev", "lan0").stdout,
    )
    status = root.status()
    assert status["agent"]["pid"] == int(unit["MainPID"])
    # WatchdogSec=30: systemd records every WATCHDOG=1 the agent sends (one per 15 s).
    first = _watchdog_ping(root)
    wait_for("a WATCHDOG=1 from the agent", lambda: _watchdog_ping(root) > first, deadline=120)
    assert root.unit()["MainPID"] == unit["MainPID"]


def test_an_agent_restart_leaves_kea_serving_and_the_next_agent_adopts_it(
    root: DebianRoot,
) -> None:
    # Debian's own Kea service is not the agent's: out of the way.
    root.run("systemctl", "disable", "--now", "kea-dhcp4-server.service")
    _write_document(root, DOCUMENT + DHCP.replace("POOL", POOL))
    # The changed config file is applied by the agent that starts next.
    root.run("systemctl", "restart", UNIT)
    kea = wait_for("the agent's Kea", lambda: _kea_pid(root))
    wait_for("DHCP healthy", lambda: _dhcp_health(root) == "ok")

    # `systemctl restart`: a new agent, the same Kea, adopted.
    before = root.unit()
    root.run("systemctl", "restart", UNIT)
    after = root.unit()
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"], after
    assert _kea_pid(root) == kea
    wait_for(
        "the new agent adopting Kea",
        lambda: _logged_by(root, after["MainPID"], f"adopted kea-dhcp4 (pid {kea})"),
    )
    wait_for("DHCP healthy under the new agent", lambda: _dhcp_health(root) == "ok")

    # A configuration change reaches that same Kea (config-set, no restart).
    _write_document(root, DOCUMENT + DHCP.replace("POOL", OTHER_POOL))
    applied = root.run("trueup", "apply", "/etc/trueup/desired.yaml", check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for(
        "Kea's configuration with the new pool",
        lambda: OTHER_POOL in root.read(f"{KEA_RUN}/kea-dhcp4.conf"),
    )
    assert _kea_pid(root) == kea

    # `systemctl stop`: the agent goes, Kea goes on serving; a start adopts it again.
    root.run("systemctl", "stop", UNIT)
    assert root.unit()["ActiveState"] == "inactive"
    assert _kea_pid(root) == kea
    root.run("systemctl", "start", UNIT)
    started = root.unit()
    assert started["ActiveState"] == "active", started
    wait_for(
        "the started agent adopting Kea",
        lambda: _logged_by(root, started["MainPID"], f"adopted kea-dhcp4 (pid {kea})"),
    )
    assert _kea_pid(root) == kea
    wait_for("DHCP healthy after the start", lambda: _dhcp_health(root) == "ok")


def test_an_upgrade_whose_agent_cannot_boot_leaves_the_old_agent_running(
    root: DebianRoot,
) -> None:
    before = root.unit()
    journal = root.read("/var/lib/trueup/journal.jsonl")
    result = root.run("dpkg", "-i", root.deb(V3), check=False)
    assert result.returncode != 0, result.stdout
    assert f"release {V3} failed its preflight" in result.stderr
    assert f"release {V1} keeps running" in result.stderr
    status = root.run("dpkg-query", "-W", "-f", "${Status} ${Version}", "trueup-agent").stdout
    assert status == f"install ok half-configured {V3}"
    after = root.unit()
    assert after["MainPID"] == before["MainPID"] and after["ActiveState"] == "active"
    assert root.current() == f"releases/{V1}"
    assert not root.exists(f"/opt/trueup/releases/{V3}")
    assert f"agent {V1} (pid {before['MainPID']}" in root.versions()
    assert root.read("/var/lib/trueup/journal.jsonl") == journal
    # Retrying the configuration fails the same way, still touching nothing.
    retry = root.run("dpkg", "--configure", "-a", check=False)
    assert retry.returncode != 0
    assert root.unit()["MainPID"] == before["MainPID"]


def test_a_good_upgrade_replaces_the_agent_and_keeps_its_state(root: DebianRoot) -> None:
    before = root.unit()
    kea = _kea_pid(root)
    assert kea is not None
    applied = _applied(root)
    revisions = set(root.run("ls", "/var/lib/trueup/revisions").stdout.split())
    journal = root.read("/var/lib/trueup/journal.jsonl")
    result = root.run("dpkg", "-i", root.deb(V2), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready: no blockers" in result.stdout
    after = root.unit()
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert f"agent {V2} (pid {after['MainPID']}" in root.versions()
    assert root.current() == f"releases/{V2}"
    # The previous release stays for a rollback; the broken one is gone.
    assert set(root.run("ls", "/opt/trueup/releases").stdout.split()) == {V1, V2}
    assert _applied(root)["version"] == applied["version"]
    assert revisions <= set(root.run("ls", "/var/lib/trueup/revisions").stdout.split())
    assert root.read("/var/lib/trueup/journal.jsonl").startswith(journal)
    assert "198.51.100.2/24" in root.run("ip", "-br", "addr", "show", "dev", "mgmt0").stdout
    # The preflight checked what the document needs (Kea run with -v, its hook library) …
    assert "kea-dhcp4 at /usr/sbin/kea-dhcp4 runs" in result.stdout
    assert "libdhcp_lease_cmds.so present" in result.stdout
    # … and the new agent adopted the old agent's Kea.
    assert _kea_pid(root) == kea
    wait_for(
        "the upgraded agent adopting Kea",
        lambda: _logged_by(root, after["MainPID"], f"adopted kea-dhcp4 (pid {kea})"),
    )


def test_a_document_needing_a_missing_program_fails_the_package_preflight(
    root: DebianRoot,
) -> None:
    # keepalived is not installed in this root: a document adding HA is refused before any
    # agent would fail on it, and the running agent is left alone.
    before = root.unit()
    document = root.read("/etc/trueup/desired.yaml")
    _write_document(root, document + HA)
    result = root.run("dpkg", "-i", root.deb(V2), check=False)
    assert result.returncode != 0, result.stdout
    assert "keepalived not found on PATH (needed by ha)" in result.stdout
    assert "install the Debian package keepalived" in result.stdout
    assert f"release {V2} failed its preflight" in result.stderr
    assert root.unit()["MainPID"] == before["MainPID"]
    assert root.current() == f"releases/{V2}"
    _write_document(root, document)
    fixed = root.run("dpkg", "--configure", "-a", check=False)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert root.unit()["ActiveState"] == "active"


def test_removal_stops_the_daemons_and_keeps_state_and_configuration(root: DebianRoot) -> None:
    applied = _applied(root)
    kea = _kea_pid(root)
    assert kea is not None
    # An agent stopped before the removal left Kea running in the unit's group: it goes too.
    # (The purge below removes with the agent running.)
    root.run("systemctl", "stop", UNIT)
    assert _kea_pid(root) == kea
    root.run("dpkg", "-r", "trueup-agent")
    assert root.unit()["ActiveState"] == "inactive"
    wait_for("Kea stopped with the package", lambda: _kea_pid(root) is None, deadline=60)
    assert not root.exists("/run/systemd/system/trueup-agent.service.d/removal.conf")
    assert _applied(root) == applied
    assert root.exists("/etc/trueup/desired.yaml")
    assert not root.exists("/usr/bin/trueup")
    assert not root.exists("/opt/trueup/releases")


def test_a_reinstall_resumes_on_the_same_state(root: DebianRoot) -> None:
    applied = _applied(root)
    root.run("dpkg", "-i", root.deb(V2))
    unit = root.unit()
    assert unit["ActiveState"] == "active", unit
    assert root.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    assert f"agent {V2} (pid {unit['MainPID']}" in root.versions()
    assert _applied(root)["version"] == applied["version"]


def test_purge_deletes_state_configuration_and_releases(root: DebianRoot) -> None:
    kea = wait_for("the reinstalled agent's Kea", lambda: _kea_pid(root))
    root.run("dpkg", "-P", "trueup-agent")
    assert root.unit()["ActiveState"] == "inactive"
    wait_for(
        "Kea stopped with the package",
        lambda: not root.exists(f"/proc/{kea}/cmdline") or _zombie(root, kea),
        deadline=60,
    )
    for path in ("/var/lib/trueup", "/etc/trueup", "/opt/trueup", "/usr/bin/trueup"):
        assert not root.exists(path), path
    assert root.run("dpkg-query", "-W", "trueup-agent", check=False).returncode != 0


def test_the_packages_under_test_exist(root: DebianRoot) -> None:
    for version in (V1, V2, V3):
        assert Path(root.debs[version]).stat().st_size > 1_000_000
