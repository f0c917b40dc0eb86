"""The worked example subsystem on the real kernel: sysctl values in a network namespace."""

from __future__ import annotations

import json

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

FORWARD = "/proc/sys/net/ipv4/ip_forward"
V6_FORWARD = "/proc/sys/net/ipv6/conf/all/forwarding"


def _read(router: Router, path: str) -> str:
    return router.run("cat", path).stdout.strip()


def test_sysctl_applied_observed_healed_by_its_periodic_watch_and_refused_atomically(
    router: Router,
) -> None:
    # A new namespace inherits the host's IPv4 forwarding (net.core.devconf_inherit_init_net
    # = 0), which container networking turns on: start from off explicitly.
    router.run("sh", "-c", f"echo 0 > {FORWARD}")
    assert _read(router, FORWARD) == "0"
    document = base_document(
        routes=[], sysctl={"net.ipv4.ip_forward": 1, "net.ipv6.conf.all.forwarding": 1}
    )
    applied = router.trueup("apply", str(router.write("v1.yaml", document)))
    assert applied.returncode == 0, applied.stderr
    assert _read(router, FORWARD) == "1" and _read(router, V6_FORWARD) == "1"
    assert router.trueup("drift").returncode == 0

    # No fast resync: the subsystem's own periodic watch (every 10 s) finds it.
    router.start_agent()
    router.run("sh", "-c", f"echo 0 > {FORWARD}")
    router.wait_for(lambda: _read(router, FORWARD) == "1", what="sysctl healed", timeout=30)

    def heals() -> list[dict[str, object]]:
        lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
        return [
            r["details"]
            for r in map(json.loads, lines)
            if r["event"] == "reconcile" and r["details"].get("subsystem") == "sysctl"
        ]

    router.wait_for(lambda: bool(heals()), what="the heal audited")
    assert heals()[0]["outcome"] == "healed"
    assert heals()[0]["paths"] == ["spec.sysctl[net.ipv4.ip_forward]"]

    # An unknown name fails atomically and names itself; nothing else changes.
    bad = base_document(routes=[], sysctl={"net.ipv4.ip_forward": 0, "net.ipv4.no_such": 1})
    refused = router.trueup("apply", str(router.write("bad.yaml", bad)))
    assert refused.returncode == 1
    assert "no sysctl net.ipv4.no_such" in refused.stderr + refused.stdout
    assert _read(router, FORWARD) == "1"


def test_a_files_watch_wakes_the_loop_for_a_file_backed_subsystem(router: Router) -> None:
    """A plugin subsystem that owns a file: a change to it is healed by the inotify watch,
    long before the periodic resync (60 s by default) would look."""
    motd = router.workdir / "motd"
    document = base_document(routes=[], motd="managed by trueup\n")
    config = router.write("desired.yaml", document)
    router.start_agent(
        "--config", str(config), "--plugin", "tests.plugins:MotdFile",
        env={"TRUEUP_TEST_MOTD": str(motd)},
    )  # fmt: skip
    router.wait_for(lambda: motd.exists() and motd.read_text() == "managed by trueup\n",
                    what="file written")  # fmt: skip
    passes = router.api("/v1/status")["reconcile_loop"]["resync_seconds"]
    assert passes == 60
    motd.write_text("edited by hand\n")
    router.wait_for(lambda: motd.read_text() == "managed by trueup\n", what="healed via inotify")
    record = router.api("/v1/status")["subsystems"]["motd"]
    assert record["health"] == "ok"
