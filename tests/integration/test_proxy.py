"""Proxies on a real HAProxy: bind addresses that come late, seamless reloads, refusals, recovery.

The router namespace runs the agent (and HAProxy); the client namespace
(mgmt0's peer, 198.51.100.1) sends requests; a backend namespace (lan0's
peer, 203.0.113.10) runs a small HTTP server. Every namespace and process
started here is removed by name or PID: the namespaces by the fixtures,
HAProxy by the verified pid of its supervisor record, the rest by their PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root, sh
from trueup.model.catalog import SUBSYSTEMS, load
from trueup.model.health import Tier
from trueup.subsystems.proxy.section import ProxySection
from trueup.system.haproxy import (
    HaproxyError,
    haproxy_paths,
    parse_proc,
    parse_stat,
    query,
    render_config,
)
from trueup.system.pidrecord import verified_pid
from trueup.system.sockets import RUNTIME_ROOT, remove_socket_dir

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"
WEB_URL = "http://198.51.100.2:8080/healthz"
ABSENT = "192.0.2.1"

# Requests in a loop, each on a new connection, until STOP exists; then one JSON line.
CLIENT_LOOP = """
import http.client, json, os, sys, time
url_host, url_port, stop, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ok = failed = 0
errors = []
while not os.path.exists(stop):
    try:
        conn = http.client.HTTPConnection(url_host, url_port, timeout=10)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status == 200:
            ok += 1
        else:
            failed += 1
            errors.append(f"status {response.status}")
    except Exception as exc:
        failed += 1
        errors.append(repr(exc))
with open(out, "w") as handle:
    json.dump({"ok": ok, "failed": failed, "errors": errors[:10]}, handle)
"""


def proxy(name: str, bind: str, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "bind": bind,
        "mode": "http",
        "backend": {
            "servers": [{"name": "app1", "address": "203.0.113.10:8080", "check": True}],
            "health_check": {"path": "/healthz", "interval": "500ms"},
        },
        "timeouts": {"connect": "2s", "client": "10s", "server": "10s"},
    }
    entry.update(extra)
    return entry


def proxy_document(*proxies: dict[str, Any]) -> dict[str, Any]:
    document = base_document(proxies=list(proxies))
    document["spec"]["interfaces"] = [{"name": "lan0", "addresses": ["203.0.113.1/24"]}]
    document["spec"]["routes"] = []
    document["spec"]["tables"] = {}
    return document


class ProxyRouter:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.backend = f"{router.name}-b"
        sh("ip", "netns", "add", self.backend)
        router.ip("link", "set", "lan0p", "netns", self.backend)
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", "203.0.113.10/24", "dev", "lan0p"),
            ("link", "set", "lan0p", "up"),
        ):
            sh("ip", "-n", self.backend, *args)
        root = router.workdir / "www"
        root.mkdir()
        (root / "healthz").write_text("ok\n")
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.backend, sys.executable, "-m", "http.server",
             "8080", "--bind", "203.0.113.10", "--directory", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    @property
    def paths(self) -> Any:
        return haproxy_paths(self.router.state_dir / "run" / "haproxy")

    def master(self) -> Any:
        return parse_proc(query(self.paths.master, "show proc"))

    def stats(self) -> Any:
        return parse_stat(query(self.paths.stats, "show stat"))

    def haproxy_pid(self) -> int | None:
        try:
            return verified_pid(json.loads((self.paths.run_dir / "haproxy.pid").read_text()))
        except (OSError, ValueError):
            return None

    def kill_haproxy(self, *, wait_listeners: bool = True) -> None:
        pid = self.haproxy_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while self.haproxy_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not wait_listeners:
            return
        # The workers notice their master is gone and exit; wait for them by the kernel's view.
        self.router.wait_for(
            lambda: self.router.run("ss", "-Hltn", "sport = :8080").stdout.strip() == "",
            what="HAProxy's listeners closed",
        )

    def get(self, url: str, ns: str | None = None) -> int:
        """GET from a namespace (the client's by default): the status, 0 when refused."""
        script = (
            "import sys, urllib.request\n"
            "try:\n"
            "    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
            "except Exception as e:\n"
            "    print(getattr(e, 'code', 0))\n"
        )
        where = ns or self.router.client
        assert where is not None
        done = sh("ip", "netns", "exec", where, sys.executable, "-c", script, url, check=False)
        return int(done.stdout.strip() or 0)

    def health(self) -> dict[str, Any]:
        return dict(self.router.api("/v1/health/services").get("subsystems", {}).get("proxy", {}))

    def close(self) -> None:
        self.router.stop_agents(signal.SIGKILL)
        self.kill_haproxy()
        if self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        sh("ip", "netns", "del", self.backend, check=False)


@pytest.fixture
def proxy_router(tmp_path: Path) -> Iterator[ProxyRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    rig: ProxyRouter | None = None
    try:
        rig = ProxyRouter(router)
        yield rig
    finally:
        if rig is not None:
            rig.close()
        router.close()


def applied(router: Router, name: str, document: dict[str, Any], **kw: Any) -> Any:
    return router.trueup("apply", str(router.write(name, document)), **kw)


def test_a_frontend_on_an_absent_address_waits_alone_and_binds_when_it_appears(
    proxy_router: ProxyRouter,
) -> None:
    rig, router = proxy_router, proxy_router.router
    config = router.write(
        "proxy.yaml",
        proxy_document(proxy("web", "198.51.100.2:8080"), proxy("far", f"{ABSENT}:8081")),
    )
    router.start_agent("--config", str(config), wait_started=False)
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200 and body["ready"] is True
    router.wait_for(
        lambda: (
            rig.health().get("health") in ("pending", "failed")
            and ABSENT in rig.health().get("reason", "")
        ),
        what="proxy pending on the absent address",
        timeout=40,
    )
    services = router.api("/v1/health/services")["subsystems"]
    assert services["management"]["health"] == "ok"
    assert services["addresses"]["health"] == "ok"
    # The other frontend is served meanwhile.
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served", timeout=30)
    status, _ = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200

    # The address appears (by hand, on an interface trueup does not manage).
    router.ip("addr", "add", f"{ABSENT}/32", "dev", "lo")
    try:
        router.wait_for(
            lambda: rig.health().get("health") == "ok", what="proxy ok once bound", timeout=40
        )
    except AssertionError:
        print(json.dumps(rig.health()), json.dumps(router.api("/v1/status")["subsystems"]["proxy"]))
        raise
    assert rig.stats().frontends == {"web": "OPEN", "far": "OPEN"}
    assert rig.get(f"http://{ABSENT}:8081/healthz", ns=router.name) == 200
    report = router.api("/v1/status")["subsystems"]["proxy"]["system"]
    assert report["frontends"]["far"]["bound"] is True
    assert report["version"].startswith("2.6")
    router.wait_for(
        lambda: (
            router.api("/v1/status")["subsystems"]["proxy"]["system"]["frontends"]["web"]["servers"]
            == {"app1": "UP"}
        ),
        what="server app1 UP in the report",
    )


def test_reloads_under_a_client_loop_lose_no_request(proxy_router: ProxyRouter) -> None:
    rig, router = proxy_router, proxy_router.router
    first = applied(router, "v0.yaml", proxy_document(proxy("web", "198.51.100.2:8080")))
    assert first.returncode == 0, first.stdout + first.stderr
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served", timeout=30)
    master_pid, reloads = rig.haproxy_pid(), rig.master().reloads
    stop, out = router.workdir / "stop", router.workdir / "client.json"
    client = router.spawn_in_client(
        sys.executable, "-c", CLIENT_LOOP, "198.51.100.2", "8080", str(stop), str(out)
    )
    for index in range(6):
        changed = proxy("web", "198.51.100.2:8080")
        changed["backend"]["servers"][0]["weight"] = 10 + index
        done = applied(router, f"v{index + 1}.yaml", proxy_document(changed))
        assert done.returncode == 0, done.stdout + done.stderr
    stop.touch()
    client.wait(timeout=60)
    result = json.loads(out.read_text())
    assert result["failed"] == 0, result
    assert result["ok"] > 0
    assert rig.haproxy_pid() == master_pid  # reloaded, never restarted
    assert rig.master().reloads == reloads + 6
    assert "weight 15" in rig.paths.config.read_text()


def test_a_configuration_haproxy_refuses_changes_nothing(proxy_router: ProxyRouter) -> None:
    rig, router = proxy_router, proxy_router.router
    first = applied(router, "v1.yaml", proxy_document(proxy("web", "198.51.100.2:8080")))
    assert first.returncode == 0, first.stdout + first.stderr
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served", timeout=30)
    before = rig.paths.config.read_bytes()
    master_pid, master = rig.haproxy_pid(), rig.master()
    # A file that exists but is no PEM: the document is valid, HAProxy refuses it.
    pem = router.workdir / "web.pem"
    pem.write_text("not a certificate\n")
    bad = proxy("web", "198.51.100.2:8080", tls={"certificate": str(pem)})
    refused = applied(router, "v2.yaml", proxy_document(bad))
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "unable to load certificate" in output, output
    assert rig.paths.config.read_bytes() == before
    assert not rig.paths.candidate.exists()
    assert rig.haproxy_pid() == master_pid
    assert rig.master().reloads == master.reloads and rig.master().workers == master.workers
    assert rig.get(WEB_URL) == 200
    assert router.trueup("drift").returncode == 0


def test_an_interrupted_proxy_apply_is_rolled_back_last_at_startup_and_blocks_nothing(
    proxy_router: ProxyRouter,
) -> None:
    rig, router = proxy_router, proxy_router.router
    router.ip("addr", "add", f"{ABSENT}/32", "dev", "lo")
    v1 = proxy_document(proxy("web", "203.0.113.1:8080"), proxy("far", f"{ABSENT}:8081"))
    first = applied(router, "v1.yaml", v1)
    assert first.returncode == 0, first.stdout + first.stderr
    v2 = proxy_document(
        proxy("web", "203.0.113.1:8080"),
        proxy("far", f"{ABSENT}:8081"),
        proxy("api", "203.0.113.1:8082"),
    )
    # Killed after the new file is written, before HAProxy is reloaded.
    killed = applied(router, "v2.yaml", v2, env={"TRUEUP_FAULT": "step:proxy"})
    assert killed.returncode != 0
    assert "frontend api" in rig.paths.config.read_text()
    assert "api" not in rig.stats().frontends
    # The router restarts: HAProxy gone, the addresses gone, the far one for good.
    rig.kill_haproxy()
    router.ip("addr", "flush", "dev", "lan0")
    router.ip("addr", "flush", "dev", "mgmt0")
    router.ip("addr", "del", f"{ABSENT}/32", "dev", "lo")

    router.start_agent()  # waits for management, then for every startup phase: nothing blocks
    status, _ = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200
    journal = [
        json.loads(line)
        for line in (router.state_dir / "journal.jsonl").read_text().splitlines()
        if line.strip()
    ]
    recovered = [r for r in journal if r.get("type") == "recovered"]
    order = [r["subsystem"] for r in recovered]
    assert "addresses" in order and "proxy" in order, order
    assert order.index("management") < order.index("addresses") < order.index("proxy")
    # Only subsystems of the proxy's own tier (optional) are brought forward after it.
    tiers = {load(ref).name: load(ref).tier for ref in SUBSYSTEMS}
    assert all(tiers[name] == Tier.OPTIONAL for name in order[order.index("proxy") :]), order
    # Back to v1: web bound, far waiting for its address — not an error, nothing waits on it.
    assert "error" not in recovered[order.index("proxy")], recovered
    phases = {p["name"]: p for p in router.api("/v1/status")["agent"]["startup"]}
    assert phases["management"]["state"] == "done"
    assert phases["management"]["ended_at"] <= recovered[0]["at"]
    assert phases["recovery"]["state"] == "done"
    # v1 is back, file and process: the interrupted frontend is gone, web serves.
    text = rig.paths.config.read_text()
    assert "frontend api" not in text and "frontend web" in text
    assert rig.stats().frontends == {"web": "OPEN"}
    assert rig.get("http://203.0.113.1:8080/healthz", ns=router.name) == 200
    router.wait_for(
        lambda: ABSENT in rig.health().get("reason", ""), what="proxy pending on far", timeout=30
    )
    router.ip("addr", "add", f"{ABSENT}/32", "dev", "lo")
    router.wait_for(
        lambda: rig.health().get("health") == "ok", what="proxy ok once bound", timeout=40
    )
    assert rig.stats().frontends == {"web": "OPEN", "far": "OPEN"}


def test_a_hand_edit_and_a_dead_haproxy_are_seen_and_healed(proxy_router: ProxyRouter) -> None:
    rig, router = proxy_router, proxy_router.router
    config = router.write("proxy.yaml", proxy_document(proxy("web", "198.51.100.2:8080")))
    router.start_agent("--config", str(config))
    router.wait_for(lambda: rig.health().get("health") == "ok", what="proxy ok", timeout=30)
    written = rig.paths.config.read_text()

    def heals() -> list[dict[str, Any]]:
        lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
        return [
            r["details"]
            for r in map(json.loads, lines)
            if r["event"] == "reconcile" and r["details"].get("subsystem") == "proxy"
        ]

    # Edited by hand: the file watch wakes the loop, the heal writes trueup's file back.
    rig.paths.config.write_text(written.replace("weight 1", "weight 99"))
    router.wait_for(lambda: rig.paths.config.read_text() == written, what="file healed", timeout=40)
    router.wait_for(lambda: bool(heals()), what="the heal audited", timeout=20)
    assert "spec.proxies.config" in heals()[0]["paths"]
    # HAProxy killed: started again (the supervisor, or the loop's look), and serving.
    old = rig.haproxy_pid()
    rig.kill_haproxy(wait_listeners=False)  # the agent may start it again at once
    router.wait_for(
        lambda: rig.haproxy_pid() not in (None, old), what="HAProxy running again", timeout=40
    )
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served again", timeout=30)
    router.wait_for(lambda: rig.health().get("health") == "ok", what="proxy ok", timeout=30)


# Holds a TCP port without SO_REUSEPORT, as another service on the router would.
PORT_TAKER = """
import socket, sys, time
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
time.sleep(3600)
"""


def test_a_haproxy_that_exits_at_once_is_a_failure_with_its_own_last_lines(
    proxy_router: ProxyRouter,
) -> None:
    rig, router = proxy_router, proxy_router.router
    config = router.write("proxy.yaml", proxy_document(proxy("web", "198.51.100.2:8080")))
    router.start_agent("--config", str(config))
    router.wait_for(lambda: rig.health().get("health") == "ok", what="proxy ok")
    router.stop_agents()
    rig.kill_haproxy()
    taker = router.spawn(sys.executable, "-c", PORT_TAKER, "8080")
    router.wait_for(
        lambda: router.run("ss", "-Hltn", "sport = :8080").stdout.strip() != "",
        what="another process listens on 8080",
    )

    # The agent starts HAProxy, which cannot bind and exits at once: a failure naming
    # HAProxy's own words, in status and in the audit, never a heal.
    router.start_agent("--config", str(config))

    def audited() -> list[dict[str, Any]]:
        lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["details"].get("subsystem") == "proxy"]

    router.wait_for(
        lambda: any(
            r["details"].get("outcome") == "failed"
            and "cannot bind socket" in r["details"].get("error", "")
            for r in audited()
        ),
        what="a failed proxy heal naming HAProxy's bind error",
    )
    failed = next(r for r in audited() if r["details"].get("outcome") == "failed")
    assert "exited at once" in failed["details"]["error"], failed
    assert not any(r["details"].get("outcome") == "healed" for r in audited())
    health = rig.health()
    assert health["health"] != "ok" and "cannot bind socket" in json.dumps(health), health

    # The port is free again: the next start (the supervisor's or a heal) serves.
    taker.kill()
    taker.wait()
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served once the port is free")
    router.wait_for(lambda: rig.health().get("health") == "ok", what="proxy ok again")


def _answers(path: Path, command: str) -> bool:
    try:
        query(path, command, 2.0)
    except HaproxyError:
        return False
    return True


def test_haproxy_starts_with_every_run_directory_length_from_60_to_110(tmp_path: Path) -> None:
    """The sockets trueup renders are always within HAProxy's own limit (97 characters)."""
    require_root()
    router = Router(tmp_path)  # one namespace for every length; HAProxy listens on its lo
    base = Path(tempfile.mkdtemp(prefix="tu-hx-", dir="/tmp"))
    section = ProxySection.model_validate([proxy("web", "127.0.0.1:8080")]).canonical()
    log = tmp_path / "haproxy.log"
    try:
        for length in range(60, 111):
            run = base / ("r" * (length - len(str(base)) - 1))
            assert len(str(run)) == length
            run.mkdir(mode=0o700)
            paths = haproxy_paths(run, create=True)
            text, _ = render_config(paths, section, None)
            paths.config.write_text(text)
            with open(log, "w") as out:
                started = subprocess.Popen(
                    ["ip", "netns", "exec", router.name, *paths.argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                deadline = time.monotonic() + 90
                while not (
                    _answers(paths.master, "show proc") and _answers(paths.stats, "show stat")
                ):
                    assert started.poll() is None, f"{length}: HAProxy exited: {log.read_text()}"
                    assert time.monotonic() < deadline, f"{length}: no answer: {log.read_text()}"
                    time.sleep(0.02)
            finally:
                started.terminate()
                started.wait(timeout=60)
            assert remove_socket_dir(paths.master.parent, run) == (paths.master.parent != run)
        moved = [d for d in RUNTIME_ROOT.glob("haproxy-*") if _owner(d).startswith(str(base))]
        assert moved == [], "socket directories left behind"
    finally:
        shutil.rmtree(base, ignore_errors=True)
        router.close()


def _owner(directory: Path) -> str:
    try:
        return (directory / "owner").read_text()
    except OSError:
        return ""


@pytest.fixture
def long_proxy_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyRouter]:
    """A router whose HAProxy run directory is 87 characters: too long for HAProxy's
    sockets (97 with `/master.sock`), short enough for the kernel's."""
    require_root()
    base = Path(tempfile.mkdtemp(prefix="tu-hl-", dir="/tmp"))
    pad = 87 - len(str(base)) - len("/w/state/run/haproxy") - 1
    workdir = base / ("w" * pad) / "w"
    workdir.mkdir(parents=True)
    router = Router(workdir, client=True)
    assert len(str(router.state_dir / "run" / "haproxy")) == 87
    rig: ProxyRouter | None = None
    try:
        rig = ProxyRouter(router)
        yield rig
    finally:
        if rig is not None:
            rig.close()
        router.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_run_directory_of_87_characters_serves_and_leaves_no_socket_directory_behind(
    long_proxy_router: ProxyRouter,
) -> None:
    rig, router = long_proxy_router, long_proxy_router.router
    config = router.write("proxy.yaml", proxy_document(proxy("web", "198.51.100.2:8080")))
    router.start_agent("--config", str(config))
    router.wait_for(lambda: rig.get(WEB_URL) == 200, what="web served")
    moved = rig.paths.master.parent
    assert moved.parent == RUNTIME_ROOT and moved.is_dir()
    assert len(str(rig.paths.master)) <= 97 and len(str(rig.paths.stats)) <= 97
    # The proxies removed: HAProxy stops, and its socket directory goes with it.
    without = proxy_document()
    del without["spec"]["proxies"]
    done = applied(router, "none.yaml", without)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rig.haproxy_pid() is None
    router.stop_agents()
    assert not moved.exists(), list(moved.iterdir())
