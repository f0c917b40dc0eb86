"""Test routers: network namespaces with veth links, and the real trueup CLI run inside them.

Every namespace and process a test starts is removed by name or PID when the
test ends. Addresses come only from 192.0.2.0/24, 198.51.100.0/24,
203.0.113.0/24 and 2001:db8::/32.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from trueup.journal.state import StateDir

REPO = Path(__file__).resolve().parent.parent
# The least time `Router.wait_for` waits for an event before it fails: a loaded 2-core
# machine (another suite beside this one) can be many times slower than an idle one, and
# a wait returns as soon as the event happens, so passing runs are no slower for it.
WAIT_FLOOR = 90.0
TRUEUP = [sys.executable, "-m", "trueup.cli"]
_counter = itertools.count()


def require_root() -> None:
    if os.geteuid() != 0:
        raise RuntimeError(
            "integration tests need root (network namespaces); run `make test` as root"
        )


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def base_document(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "management": {
            "interface": "mgmt0",
            "addresses": ["198.51.100.2/24"],
            "gateway": "198.51.100.1",
        },
        "interfaces": [
            {"name": "lan0", "mtu": 1400, "addresses": ["203.0.113.1/24", "2001:db8:1::1/64"]}
        ],
        "tables": {"wan2": 100},
        "routes": [
            {"to": "192.0.2.0/24", "via": "203.0.113.254"},
            {"to": "192.0.2.0/25", "via": "203.0.113.253", "table": "wan2"},
        ],
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "edge-01"},
        "spec": spec,
    }


class Router:
    """One namespace: mgmt0 and lan0 (veth, peers mgmt0p/lan0p up in the same namespace)."""

    def __init__(
        self, workdir: Path, links: tuple[str, ...] = ("mgmt0", "lan0"), client: bool = False
    ) -> None:
        self.name = f"tu-{os.getpid()}-{next(_counter)}"
        self.workdir = workdir
        self.state_dir = workdir / "state"
        # As an installed device has it after its agent's first start: the CLI refuses a
        # directory that is not a state directory yet (its device: the first applied document's).
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        StateDir(self.state_dir).ensure()
        self.agents: list[subprocess.Popen[str]] = []
        self.helpers: list[subprocess.Popen[str]] = []
        self.client: str | None = None
        sh("ip", "netns", "add", self.name)
        self.ip("link", "set", "lo", "up")
        for link in links:
            self.ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
            self.ip("link", "set", f"{link}p", "up")
        if client:
            # An operator's host: mgmt0's peer in its own namespace, 198.51.100.1/24.
            self.client = f"{self.name}-c"
            sh("ip", "netns", "add", self.client)
            self.ip("link", "set", "mgmt0p", "netns", self.client)
            sh("ip", "-n", self.client, "link", "set", "lo", "up")
            sh("ip", "-n", self.client, "addr", "add", "198.51.100.1/24", "dev", "mgmt0p")
            sh("ip", "-n", self.client, "link", "set", "mgmt0p", "up")

    def from_client(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 5.0,
        *,
        method: str = "GET",
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """An HTTP request from the client namespace; (status, json) or (0, error text)."""
        assert self.client is not None, "Router(client=True) needed"
        script = (
            "import sys, json, httpx\n"
            "req = json.loads(sys.argv[1])\n"
            "try:\n"
            "    r = httpx.request(req['method'], req['url'], headers=req['headers'],\n"
            "                      json=req['body'], timeout=req['timeout'])\n"
            "    try:\n"
            "        out = r.json()\n"
            "    except ValueError:\n"
            "        out = r.text\n"
            "    print(json.dumps([r.status_code, out]))\n"
            "except Exception as e:\n"
            "    print(json.dumps([0, repr(e)]))\n"
        )
        all_headers = dict(headers or {})
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        request = {
            "method": method,
            "url": url,
            "headers": all_headers,
            "body": body,
            "timeout": timeout,
        }
        proc = subprocess.run(
            ["ip", "netns", "exec", self.client, sys.executable, "-c", script, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=timeout + 20,
            check=False,
        )
        status, answer = json.loads(proc.stdout)
        return int(status), answer

    def spawn_in_client(
        self, *argv: str, log: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """A process in the client namespace, killed by PID at the end of the test."""
        assert self.client is not None
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.client, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )
        self.helpers.append(proc)
        return proc

    # -- plumbing -----------------------------------------------------------
    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "-n", self.name, *args, check=check)

    def ip_json(self, *args: str) -> Any:
        return json.loads(sh("ip", "-n", self.name, "-j", *args).stdout or "[]")

    def run(
        self,
        *argv: str,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            check=False,
        )

    def trueup(
        self, *args: str, env: dict[str, str] | None = None, state: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        extra = ["--state-dir", str(self.state_dir)] if state else []
        return self.run(*TRUEUP, *args, *extra, env=env, timeout=timeout)

    def write(self, name: str, document: dict[str, Any]) -> Path:
        path = self.workdir / name
        path.write_text(yaml.safe_dump(document))
        return path

    # -- kernel facts -------------------------------------------------------
    def addresses(self, link: str) -> list[str]:
        out = []
        for entry in self.ip_json("addr", "show", "dev", link):
            for info in entry.get("addr_info", []):
                if info.get("scope") == "link":
                    continue
                out.append(f"{info['local']}/{info['prefixlen']}")
        return sorted(out)

    def link(self, link: str) -> dict[str, Any]:
        entry = self.ip_json("link", "show", "dev", link)[0]
        return {"up": "UP" in entry["flags"], "mtu": entry["mtu"]}

    def routes(self, table: str = "main") -> list[str]:
        out = []
        for family in ("-4", "-6"):
            shown = sh(
                "ip", "-n", self.name, "-j", family, "route", "show", "table", table, check=False
            )
            for r in json.loads(shown.stdout or "[]") if shown.returncode == 0 else []:
                if r.get("protocol") in ("kernel", "ra") or r["dst"].startswith("fe80"):
                    continue
                out.append(f"{r['dst']} via {r.get('gateway', '-')}")
        return sorted(out)

    def snapshot(self) -> dict[str, Any]:
        return {
            "mgmt0": self.addresses("mgmt0"),
            "lan0": self.addresses("lan0"),
            "lan0_link": self.link("lan0"),
            "main": self.routes("main"),
            "t100": self.routes("100"),
        }

    # -- agents -------------------------------------------------------------
    def start_agent(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        wait_started: bool = True,
    ) -> subprocess.Popen[str]:
        log = open(self.workdir / f"agent-{len(self.agents)}.log", "w")  # noqa: SIM115
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.name,
                *TRUEUP,
                "agent",
                "run",
                "--state-dir",
                str(self.state_dir),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
        )
        self.agents.append(proc)
        if wait_ready:
            self.wait_for(
                lambda: self.api("/v1/health/management").get("ready") is True,
                what="management ready",
                proc=proc,
            )
        if wait_started:
            self.wait_for(self.started, what="startup phases done", proc=proc)
        return proc

    def started(self) -> bool:
        phases = self.api("/v1/status").get("agent", {}).get("startup", [])
        return bool(phases) and phases[-1]["state"] == "running"

    def api(self, path: str, method: str = "GET", **kwargs: Any) -> Any:
        import httpx

        sock = self.state_dir / "agent.sock"
        try:
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://agent", timeout=30
            ) as client:
                response = client.request(method, path, **kwargs)
                return response.json()
        except (httpx.TransportError, ValueError):
            return {}

    def wait_for(
        self,
        predicate: Any,
        *,
        what: str,
        timeout: float = WAIT_FLOOR,
        proc: subprocess.Popen[str] | None = None,
    ) -> None:
        """Until `predicate()` holds; a `timeout` below `WAIT_FLOOR` is raised to it."""
        deadline = time.monotonic() + max(timeout, WAIT_FLOOR)
        while time.monotonic() < deadline:
            if predicate():
                return
            if proc is not None and proc.poll() is not None:
                raise AssertionError(
                    f"agent exited ({proc.returncode}) waiting for {what}:\n" + self.agent_log()
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n" + self.agent_log())

    def agent_log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("agent-*.log")))

    def stop_agents(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.agents:
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.agents.clear()

    def spawn(self, *argv: str) -> subprocess.Popen[str]:
        """A helper process inside the namespace, killed by PID at the end of the test."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.helpers.append(proc)
        return proc

    def close(self) -> None:
        self.stop_agents(signal.SIGKILL)
        for proc in self.helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sh("ip", "netns", "del", self.name, check=False)
        if self.client:
            sh("ip", "netns", "del", self.client, check=False)
        netns_etc = Path("/etc/netns") / self.name
        if netns_etc.exists():
            for child in netns_etc.iterdir():
                child.unlink()
            netns_etc.rmdir()


def router_fixture(tmp_path: Path, **kwargs: Any) -> Iterator[Router]:
    require_root()
    router = Router(tmp_path, **kwargs)
    try:
        yield router
    finally:
        router.close()
