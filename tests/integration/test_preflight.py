"""`trueup preflight --config NEW.yaml` checks what the new document needs, by running it.

The machine is changed only inside a private mount namespace of each preflight
run (`unshare -m --propagation private`): keepalived hidden behind /dev/null,
Kea's hook directory behind an empty tmpfs, kea-dhcp4 replaced by a script that
exits 1. The host's files are never touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.routers import TRUEUP, Router, base_document

pytestmark = pytest.mark.root

HOOKS = "/usr/lib/x86_64-linux-gnu/kea/hooks"
LAN = {"name": "lan0", "addresses": ["203.0.113.1/24"]}
DHCP = {
    "interfaces": ["lan0"],
    "subnets": [
        {
            "id": 1,
            "subnet": "203.0.113.0/24",
            "pools": ["203.0.113.100-203.0.113.150"],
            "options": {"routers": "203.0.113.1"},
        }
    ],
    "ha": {
        "this-server": "edge-01",
        "mode": "hot-standby",
        "peers": [
            {"name": "edge-01", "url": "http://203.0.113.1:8000/", "role": "primary"},
            {"name": "edge-02", "url": "http://203.0.113.2:8000/", "role": "standby"},
        ],
    },
}
HA = {
    "role": "primary",
    "vips": [{"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.254/24"]}],
}
DNS = {"zone": "lan.test", "listen": ["203.0.113.1"], "records": [], "reverse": []}
PROXY = {
    "name": "web",
    "bind": "203.0.113.1:8080",
    "mode": "http",
    "backend": {"servers": [{"name": "app1", "address": "203.0.113.10:8080"}]},
}


def _plain() -> dict[str, Any]:
    return base_document(interfaces=[LAN], routes=[], tables={})


def _with(**sections: Any) -> dict[str, Any]:
    return base_document(interfaces=[LAN], routes=[], tables={}, **sections)


def _preflight(router: Router, new: Path | None, *, hide: str = "") -> tuple[int, dict[str, Any]]:
    """`trueup preflight [--config NEW] -o json` in a private mount namespace, after `hide`
    (shell mount commands that change only that namespace)."""
    config = ["--config", str(new)] if new is not None else []
    argv = [*TRUEUP, "preflight", *config, "-o", "json", "--state-dir", str(router.state_dir)]
    script = f'set -e\n{hide}\nexec "$@"\n'
    done = router.run("unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _blockers(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] == "blocker"]


def _applied(router: Router) -> None:
    done = router.trueup("apply", str(router.write("current.yaml", _plain())))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_document_that_adds_ha_needs_keepalived_before_the_agent_is_replaced(
    router: Router,
) -> None:
    _applied(router)
    new = router.write("new.yaml", _with(ha=HA))
    keepalived = shutil.which("keepalived")
    assert keepalived is not None, "keepalived must be installed on the test host"
    hide = f"mount --bind /dev/null {keepalived}"

    # The current revision has no HA: without --config, keepalived's absence blocks nothing.
    code, report = _preflight(router, None, hide=hide)
    assert code == 0, _blockers(report)

    code, report = _preflight(router, new, hide=hide)
    assert code == 1, report
    (blocker,) = _blockers(report)
    assert blocker["check"] == "ha prerequisites"
    assert blocker["subsystem"] == "ha"
    assert "keepalived not found on PATH" in blocker["message"]
    assert "install the Debian package keepalived" in blocker["message"]
    assert blocker["requirement"]["package"] == "keepalived"
    # The same document with keepalived in place: ready.
    code, report = _preflight(router, new)
    assert code == 0, _blockers(report)


def test_hidden_kea_hook_libraries_are_blockers_naming_each_file(router: Router) -> None:
    _applied(router)
    new = router.write("new.yaml", _with(dhcp=DHCP))
    code, report = _preflight(router, new, hide=f"mount -t tmpfs tmpfs {HOOKS}")
    assert code == 1, report
    messages = {f["requirement"]["name"]: f["message"] for f in _blockers(report)}
    assert set(messages) == {f"{HOOKS}/libdhcp_lease_cmds.so", f"{HOOKS}/libdhcp_ha.so"}, messages
    for path, message in messages.items():
        assert f"{path} missing" in message
        assert "kea-common" in message and "needed by dhcp" in message
    assert "spec.dhcp.ha" in messages[f"{HOOKS}/libdhcp_ha.so"]


def test_a_kea_binary_that_exits_1_is_a_blocker(router: Router, tmp_path: Path) -> None:
    _applied(router)
    new = router.write("new.yaml", _with(dhcp=DHCP))
    kea = shutil.which("kea-dhcp4")
    assert kea is not None, "kea-dhcp4 must be installed on the test host"
    broken = tmp_path / "kea-dhcp4-broken"
    broken.write_text("#!/bin/sh\necho 'kea-dhcp4: error while loading libkea' >&2\nexit 1\n")
    broken.chmod(0o755)
    code, report = _preflight(router, new, hide=f"mount --bind {broken} {kea}")
    assert code == 1, report
    (blocker,) = _blockers(report)
    assert blocker["subsystem"] == "dhcp"
    assert f"{kea} is present but cannot run" in blocker["message"]
    assert "exited 1: kea-dhcp4: error while loading libkea" in blocker["message"]
    assert "kea-dhcp4-server" in blocker["message"]


def test_a_good_document_has_no_blockers_and_each_need_is_reported(router: Router) -> None:
    _applied(router)
    new = router.write("new.yaml", _with(dhcp=DHCP, ha=HA, dns=DNS, proxies=[PROXY]))
    code, report = _preflight(router, new)
    assert code == 0, _blockers(report)
    checked = {
        Path(f["requirement"]["name"]).name: f["requirement"]["path"]
        for f in report["findings"]
        if "requirement" in f
    }
    for name in ("kea-dhcp4", "libdhcp_lease_cmds.so", "libdhcp_ha.so", "keepalived"):
        assert checked.get(name), (name, checked)
    for name in ("knotd", "knotc", "haproxy"):
        assert checked.get(name), (name, checked)
    # The table output ends as it always did.
    table = router.trueup("preflight", "--config", str(new))
    assert table.returncode == 0, table.stdout
    assert table.stdout.rstrip().endswith("ready: no blockers")
    assert "checking what --config" in table.stdout
