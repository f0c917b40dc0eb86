"""No service holds the router hostage: writes and status while HAProxy, Knot or Kea fail.

Real HAProxy, Knot and (a hanging stand-in for) Kea in the router namespace.
Every namespace and process started here is removed by name or PID: the
namespaces by the `Router` fixture, the port squatters and the stand-in Kea
by their PIDs, the real daemons by the verified pids of their supervisor
records (`DnsRouter.kill_daemons`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_dhcp import dhcp_document
from tests.integration.test_dns import DnsRouter, dns_document
from tests.integration.test_proxy import PORT_TAKER, proxy
from tests.routers import Router, require_root

pytestmark = pytest.mark.root

# Generous bounds for a loaded 2-core machine; the real figures are in scripts/bench_hostage.py.
WRITE_BOUND = 15.0
STATUS_BOUND = 2.0

# UDP and TCP port 53 held without SO_REUSEPORT, as another DNS server on the router would.
DNS_TAKER = """
import socket, sys, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", int(sys.argv[1])))
t = socket.socket()
t.bind(("0.0.0.0", int(sys.argv[1])))
t.listen(1)
time.sleep(3600)
"""

# A Kea that never answers: it listens on its control socket (so a connect succeeds)
# and never reads a command. Its pid goes to PIDFILE (the test kills it by that pid).
HUNG_KEA = """#!{python}
import json, os, socket, sys, time
open({pidfile!r}, "w").write(str(os.getpid()))
config = json.load(open(sys.argv[sys.argv.index("-c") + 1]))
def names(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "socket-name":
                yield value
            yield from names(value)
    elif isinstance(node, list):
        for value in node:
            yield from names(value)
held = []
for name in names(config):
    if os.path.exists(name):
        os.unlink(name)
    s = socket.socket(socket.AF_UNIX)
    s.bind(name)
    s.listen(64)
    held.append(s)
time.sleep(3600)
"""


def hostage_document(port: int = 8080) -> dict[str, Any]:
    document = dns_document()
    document["spec"]["proxies"] = [proxy("web", f"198.51.100.2:{port}")]
    return document


def with_address(document: dict[str, Any], address: str) -> dict[str, Any]:
    changed = json.loads(json.dumps(document))
    changed["spec"]["interfaces"][0]["addresses"].append(address)
    return changed


class StatusPoller:
    """`/v1/status` (and `/v1/health/services`) asked every 0.2 s on a thread; each answer timed."""

    def __init__(self, router: Router, paths: tuple[str, ...] = ("/v1/status",)) -> None:
        self.router = router
        self.paths = paths
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        sock = str(self.router.state_dir / "agent.sock")
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=sock), base_url="http://agent", timeout=STATUS_BOUND
        ) as client:
            while not self._stop.is_set():
                for path in self.paths:
                    began = time.monotonic()
                    try:
                        response = client.get(path)
                        body = response.json()
                    except (httpx.HTTPError, ValueError) as exc:
                        self.failures.append(f"{path}: {exc!r}")
                        continue
                    self.latencies.append(time.monotonic() - began)
                    if response.status_code != 200:
                        self.failures.append(f"{path}: HTTP {response.status_code}")
                    elif path == "/v1/status":
                        self.bodies.append(body)
                self._stop.wait(0.2)

    def check(self) -> None:
        assert self.latencies, "status was never answered"
        assert not self.failures, f"status not answered every time: {self.failures[:5]}"
        worst = max(self.latencies)
        median = statistics.median(self.latencies)
        print(f"status: {len(self.latencies)} answers, median {median:.3f}s, max {worst:.3f}s")
        assert worst < STATUS_BOUND


@pytest.fixture
def dns_rig(tmp_path: Path) -> Iterator[DnsRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    rig = DnsRouter(router)
    try:
        yield rig
    finally:
        rig.close()
        router.close()


def health(router: Router, name: str) -> str:
    return str(router.api("/v1/health/services").get("subsystems", {}).get(name, {}).get("health"))


def timed(router: Router, *args: str) -> tuple[Any, float]:
    began = time.monotonic()
    done = router.trueup(*args, timeout=120)
    return done, time.monotonic() - began


def squat(router: Router) -> list[Any]:
    takers = [
        router.spawn(sys.executable, "-c", PORT_TAKER, "8080"),
        router.spawn(sys.executable, "-c", DNS_TAKER, "53"),
    ]
    router.wait_for(
        lambda: (
            router.run("ss", "-Hltn", "sport = :8080").stdout.strip() != ""
            and router.run("ss", "-Hlun", "sport = :53").stdout.strip() != ""
        ),
        what="other processes hold 8080 and 53",
    )
    return takers


def test_writes_and_restore_succeed_while_haproxy_and_knot_cannot_bind(
    dns_rig: DnsRouter, tmp_path: Path
) -> None:
    router = dns_rig.router
    document = hostage_document()
    config = router.write("doc.yaml", document)
    router.start_agent("--config", str(config))
    router.wait_for(lambda: health(router, "dns") == "ok", what="dns ok")
    archive = tmp_path / "before.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stdout + made.stderr

    router.stop_agents()
    dns_rig.kill_daemons()
    takers = squat(router)
    router.start_agent("--config", str(config))
    router.wait_for(
        lambda: health(router, "dns") == "failed" and health(router, "proxy") == "failed",
        what="dns and proxy failed (their ports are taken)",
    )

    with StatusPoller(router) as poller:
        atomic, took = timed(
            router, "apply", str(router.write("v2.yaml", with_address(document, "203.0.113.5/24")))
        )
        assert atomic.returncode == 0, atomic.stdout + atomic.stderr
        assert took < WRITE_BOUND, took
        assert "203.0.113.5/24" in router.addresses("lan0")

        best, took = timed(
            router, "apply", "--mode", "best-effort",
            str(router.write("v3.yaml", with_address(document, "203.0.113.6/24"))),
        )  # fmt: skip
        assert best.returncode == 0, best.stdout + best.stderr
        assert took < WRITE_BOUND, took
        assert "203.0.113.6/24" in router.addresses("lan0")

        back, took = timed(router, "rollback")
        assert back.returncode == 0, back.stdout + back.stderr
        assert took < WRITE_BOUND, took
        assert "203.0.113.6/24" not in router.addresses("lan0")
        assert "203.0.113.5/24" in router.addresses("lan0")

        restored, took = timed(
            router, "restore", "apply", str(archive), "--mode", "config-only", "-o", "json"
        )
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert took < WRITE_BOUND + 30, took  # verification looks again for up to 30 s
        assert json.loads(restored.stdout)["state"] == "completed", restored.stdout
        assert "203.0.113.5/24" not in router.addresses("lan0")

        managed, took = timed(
            router, "management", "set", "--interface", "mgmt0",
            "--address", "198.51.100.2/24", "--gateway", "198.51.100.1",
        )  # fmt: skip
        assert managed.returncode == 0, managed.stdout + managed.stderr
        assert took < WRITE_BOUND, took
        assert "writer lock bypassed" not in managed.stderr, managed.stderr

        # Still failed once the writes are done (an attempt deferred behind the last write
        # shows as pending until its turn comes, then fails again: the ports are taken).
        status = router.api("/v1/status")
        for name in ("dns", "proxy"):
            assert status["subsystems"][name]["health"] in ("failed", "pending"), status
        router.wait_for(
            lambda: health(router, "dns") == "failed" and health(router, "proxy") == "failed",
            what="dns and proxy failed again after the writes (their ports are still taken)",
        )
    poller.check()

    # The ports are free again: both heal by themselves.
    for taker in takers:
        taker.kill()
        taker.wait()
    router.wait_for(lambda: health(router, "dns") == "ok", what="dns healed")
    router.wait_for(lambda: health(router, "proxy") == "ok", what="proxy healed")
    assert dns_rig.dig("router.lan.test") == ["203.0.113.1"]


def test_an_apply_moving_haproxy_to_a_free_port_is_accepted(dns_rig: DnsRouter) -> None:
    router = dns_rig.router
    config = router.write("doc.yaml", hostage_document())
    squat(router)
    router.start_agent("--config", str(config))
    router.wait_for(lambda: health(router, "proxy") == "failed", what="proxy failed")

    moved, took = timed(router, "apply", str(router.write("v2.yaml", hostage_document(8081))))
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert took < WRITE_BOUND, took
    router.wait_for(lambda: health(router, "proxy") == "ok", what="proxy ok on 8081")
    assert router.run("ss", "-Hltn", "sport = :8081").stdout.strip() != ""
    assert health(router, "dns") == "failed"  # still squatted, still reported


def test_status_answers_while_kea_never_answers_its_socket(
    dns_rig: DnsRouter, tmp_path: Path
) -> None:
    router = dns_rig.router
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pidfile = tmp_path / "hung-kea.pid"
    kea = bindir / "kea-dhcp4"
    kea.write_text(HUNG_KEA.format(python=sys.executable, pidfile=str(pidfile)))
    kea.chmod(0o755)
    config = router.write("dhcp.yaml", dhcp_document())
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    try:
        router.start_agent("--config", str(config), env=env, wait_started=False)
        router.wait_for(pidfile.exists, what="the hung Kea started")
        with StatusPoller(router, ("/v1/status", "/v1/health/services")) as poller:
            router.wait_for(
                lambda: (
                    bool(poller.bodies)
                    and poller.bodies[-1].get("subsystems", {}).get("dhcp", {}).get("stale")
                ),
                what="dhcp's facts marked stale",
            )
            router.wait_for(lambda: len(poller.latencies) >= 40, what="40 answers while Kea hangs")
        poller.check()
        stale = poller.bodies[-1]["subsystems"]["dhcp"]["stale"]
        assert "did not answer" in stale["why"], stale
        assert "dhcp" in poller.bodies[-1]["stale"]
        text = router.trueup("status")
        assert "STALE" in text.stdout, text.stdout
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
