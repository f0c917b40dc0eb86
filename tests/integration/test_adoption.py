"""An agent that exits leaves Kea, Knot, keepalived and HAProxy running; the next one adopts them.

`systemctl restart trueup-agent` (KillMode=process) ends the agent alone with SIGTERM: DHCP,
DNS, the VIP and the proxy go on serving, and the new agent takes each daemon over from its
pid record (same pid, never a second instance), reports it healthy and applies a change to it.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root
from trueup.system.daemon import DaemonSupervisor
from trueup.system.pidrecord import verified_pid

pytestmark = pytest.mark.root

DAEMONS = ("kea-dhcp4", "knot", "keepalived", "haproxy")
SUBSYSTEMS = ("dhcp", "dns", "ha", "proxy")
POOL, OTHER_POOL = "203.0.113.100-203.0.113.150", "203.0.113.160-203.0.113.199"


def _document(pool: str) -> dict[str, Any]:
    return base_document(
        interfaces=[{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
        routes=[],
        tables={},
        dhcp={
            "interfaces": ["lan0"],
            "subnets": [{"id": 1, "subnet": "203.0.113.0/24", "pools": [pool]}],
        },
        dns={"zone": "lan.test", "listen": ["203.0.113.1"], "records": [], "reverse": []},
        ha={
            "role": "primary",
            "advert_interval": 0.5,
            "vips": [{"interface": "lan0", "vrid": 51, "addresses": ["203.0.113.254/24"]}],
        },
        proxies=[
            {
                "name": "web",
                "bind": "203.0.113.1:8080",
                "mode": "http",
                "backend": {"servers": [{"name": "app1", "address": "203.0.113.10:8080"}]},
            }
        ],
    )


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    require_root()
    rig = Router(tmp_path)
    try:
        yield rig
    finally:
        rig.stop_agents(signal.SIGKILL)
        # Each daemon by its verified pid record (and what its session left), never a name.
        supervisor = DaemonSupervisor(rig.state_dir / "run")
        for name in DAEMONS:
            if (rig.state_dir / "run" / name).is_dir():
                supervisor.stop(name)
        supervisor.close()
        rig.close()


def _pid(router: Router, name: str) -> int | None:
    try:
        record = json.loads((router.state_dir / "run" / name / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    return verified_pid(record)


def _healthy(router: Router) -> bool:
    health = router.api("/v1/health/services").get("subsystems", {})
    # The proxy's backend is not there: HAProxy runs, bound, with its server down.
    return all(health.get(s, {}).get("health") in ("ok", "degraded") for s in SUBSYSTEMS)


def test_every_daemon_outlives_the_agent_and_is_adopted_by_the_next(router: Router) -> None:
    config = router.write("desired.yaml", _document(POOL))
    router.start_agent("--config", str(config))
    router.wait_for(
        lambda: all(_pid(router, name) for name in DAEMONS), what="every daemon started"
    )
    router.wait_for(lambda: _healthy(router), what="every service healthy")
    pids = {name: _pid(router, name) for name in DAEMONS}

    router.stop_agents(signal.SIGTERM)  # what systemd sends the main process alone
    assert {name: _pid(router, name) for name in DAEMONS} == pids

    router.start_agent("--config", str(config))
    router.wait_for(lambda: _healthy(router), what="every service healthy under the new agent")
    assert {name: _pid(router, name) for name in DAEMONS} == pids
    log = router.agent_log()
    for name, pid in pids.items():
        assert f"adopted {name} (pid {pid})" in log, name

    # A change reaches the adopted Kea itself (config-set, no restart).
    changed = router.trueup("apply", str(router.write("changed.yaml", _document(OTHER_POOL))))
    assert changed.returncode == 0, changed.stdout + changed.stderr
    kea_conf = router.state_dir / "run" / "kea-dhcp4" / "kea-dhcp4.conf"
    router.wait_for(lambda: OTHER_POOL in kea_conf.read_text(), what="Kea's new pool")
    assert {name: _pid(router, name) for name in DAEMONS} == pids
