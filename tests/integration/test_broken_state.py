"""Management survives a broken state directory; one agent per directory; console recovery.

Every state file is damaged in turn (truncated, garbled, a non-UTF-8 byte)
with the management address absent: the agent brings management up, a client
in another namespace reaches `/v1/health/management`, and status names the
damaged file. The same with a read-only and with a full state directory, and
with a symbolic link (to a victim file outside, which must not change) or a
directory in place of every state and run file. A
second agent on the same directory is refused and the first keeps serving.
`trueup management set` puts the management address on the kernel with the
agent stopped, or with a writer hung on the lock, and the next agent start
adopts it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import REPO, Router, base_document, require_root, sh
from trueup.journal.damage import StateCheck
from trueup.journal.state import StateDir

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"
NEW_ADDRESS = "198.51.100.3/24"

# The state files and how each is damaged; `None` when a file that must exist is absent.
FILES = [
    "applied.json",
    "state.json",
    "pending-confirm.json",
    "revisions/00000002.json",
    "journal.jsonl",
    "reconcile.json",
    "audit.jsonl",
    "management.json",
]
FAULTS = ["truncated", "garbled", "non-utf8"]
LAN = [{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24", "2001:db8:1::1/64"]}]


# -- the state directory every case starts from --------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two applied revisions and a management-port token, made once in a router of its own."""
    require_root()
    workdir = tmp_path_factory.mktemp("template")
    router = Router(workdir)
    try:
        for name, document in (
            ("v1.yaml", base_document()),
            ("v2.yaml", base_document(interfaces=LAN)),
        ):
            applied = router.trueup("apply", str(router.write(name, document)))
            assert applied.returncode == 0, applied.stderr
        token = router.trueup("agent", "token", "--name", "test")
        assert token.returncode == 0, token.stderr
        (workdir / "token").write_text(token.stdout.strip())
    finally:
        router.close()
    for leftover in ("lock", "agent.sock", "agent.pid"):
        (router.state_dir / leftover).unlink(missing_ok=True)
    yield workdir


def _install(template: Path, router: Router) -> str:
    """Copy the template's state into the router's state directory; the token."""
    if router.state_dir.exists():
        for child in router.state_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
    shutil.copytree(template / "state", router.state_dir, dirs_exist_ok=True)
    return (template / "token").read_text()


def _valid_record(name: str) -> dict[str, Any]:
    """A plausible record for the files an apply does not leave behind."""
    if name == "pending-confirm.json":
        now = time.time()
        return {
            "state": "pending",
            "version": 2,
            "confirmed_version": 1,
            "deadline": now + 3600,
            "deadline_at": "2099-01-01T00:00:00Z",
            "actor": "test",
            "created_at": "2026-01-01T00:00:00Z",
        }
    return {"subsystems": {}, "acks": {}}


def _damage(path: Path, fault: str, *, last_line: bool) -> None:
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1 if last_line else 0
    head, body = data[:start], data[start:]
    middle = len(body) // 2
    if fault == "truncated":
        body = body[:middle]
    elif fault == "garbled":
        body = body[:middle] + b"}{garbled\x00" + body[middle + 10 :]
    else:
        body = body[:middle] + b"\xff\xfe" + body[middle:]
    path.write_bytes(head + body)


def _health_from_client(router: Router, url: str = MGMT_URL) -> int:
    return router.from_client(f"{url}/v1/health/management", timeout=2.0)[0]


def _damaged(status: dict[str, Any]) -> list[str]:
    return [d["path"] for d in status.get("state_directory", {}).get("damaged", [])]


# -- 1. each state file damaged ---------------------------------------------------------
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_state_file_never_keeps_management_down(
    router_with_client: Router, template: Path, name: str, fault: str
) -> None:
    router = router_with_client
    _install(template, router)
    path = router.state_dir / name
    if not path.exists():
        if name == "management.json":
            pytest.skip("this build keeps no management.json")
        path.write_text(json.dumps(_valid_record(name)))
    _damage(path, fault, last_line=name.endswith(".jsonl"))
    assert router.addresses("mgmt0") == []  # the management address is absent

    proc = router.start_agent(wait_ready=False, wait_started=False)
    router.wait_for(
        lambda: _health_from_client(router) == 200,
        what="management answering from the client",
        timeout=60,
        proc=proc,
    )
    assert router.addresses("mgmt0") == ["198.51.100.2/24"]
    router.wait_for(
        lambda: str(path) in _damaged(router.api("/v1/status")),
        what=f"status naming {name}",
        timeout=30,
        proc=proc,
    )
    status = router.api("/v1/status")
    assert str(path) in [d["path"] for d in status["agent"]["damaged_state"]]
    source = status["agent"]["management_source"]
    assert source["addresses"] == ["198.51.100.2/24"], source
    if name in ("management.json", "applied.json"):
        assert (
            any(str(path) in why for why in source["skipped"])
            or "management.json" in (source["source"])
        ), source
    services = router.api("/v1/health/services")
    assert str(path) in [d["path"] for d in services["state_directory"]["damaged"]]
    assert proc.poll() is None


def test_writes_are_refused_naming_the_damaged_file_and_diagnostics_keep_serving(
    router: Router, template: Path
) -> None:
    _install(template, router)
    applied = router.state_dir / "applied.json"
    _damage(applied, "garbled", last_line=False)
    router.start_agent()
    refused = router.trueup("apply", str(router.write("v3.yaml", base_document())))
    assert refused.returncode != 0
    assert str(applied) in refused.stderr and "nothing was changed" in refused.stderr
    reconcile = router.trueup("reconcile")
    assert reconcile.returncode != 0
    for command in (("status",), ("drift",), ("doctor",)):
        result = router.trueup(*command)
        assert "Traceback" not in result.stderr, result.stderr
    doctor = router.trueup("doctor")
    assert str(applied) in doctor.stdout
    status = router.api("/v1/status")
    assert status["state_directory"]["writes_refused"] is True
    assert any(str(applied) in f["detail"] for f in status["reason_codes"])
    router.stop_agents()
    preflight = router.trueup("preflight")
    assert preflight.returncode == 1
    assert f"BLOCKER  damaged state: {applied}" in preflight.stdout


def test_preflight_fails_on_a_damaged_pending_confirmation(router: Router, template: Path) -> None:
    _install(template, router)
    pending = router.state_dir / "pending-confirm.json"
    pending.write_text(json.dumps(_valid_record("pending-confirm.json")))
    assert router.trueup("preflight").returncode == 0
    _damage(pending, "truncated", last_line=False)
    failed = router.trueup("preflight")
    assert failed.returncode == 1 and str(pending) in failed.stdout


# -- read-only and full state directories -----------------------------------------------
@pytest.fixture
def small_tmpfs(router_with_client: Router) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted on the router's state directory; unmounted afterwards."""
    state = router_with_client.state_dir
    state.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state))
    try:
        yield state
    finally:
        router_with_client.stop_agents()
        sh("umount", str(state), check=False)


@pytest.mark.parametrize("condition", ["read-only", "full"])
def test_a_read_only_or_full_state_directory_never_keeps_management_down(
    router_with_client: Router, template: Path, small_tmpfs: Path, condition: str
) -> None:
    router = router_with_client
    token = _install(template, router)
    if condition == "read-only":
        sh("mount", "-o", "remount,ro", str(small_tmpfs))
    else:
        fill = subprocess.run(
            ["dd", "if=/dev/zero", f"of={small_tmpfs / 'fill'}", "bs=64k"],
            capture_output=True,
            check=False,
        )
        assert b"No space left" in fill.stderr
    proc = router.start_agent(wait_ready=False, wait_started=False)
    router.wait_for(
        lambda: _health_from_client(router) == 200,
        what="management answering from the client",
        timeout=60,
        proc=proc,
    )
    assert router.addresses("mgmt0") == ["198.51.100.2/24"]

    def damaged() -> list[dict[str, Any]]:
        code, body = router.from_client(f"{MGMT_URL}/v1/status", token)
        return list(body["state_directory"]["damaged"]) if code == 200 else []

    router.wait_for(
        lambda: any(d["path"] == str(small_tmpfs) for d in damaged()),
        what=f"status reporting the {condition} state directory",
        timeout=30,
        proc=proc,
    )
    problems = {d["path"]: d["problem"] for d in damaged()}
    assert condition in problems[str(small_tmpfs)]
    if condition == "read-only":
        # No socket can be created there: the management port serves the API alone.
        assert "cannot create the agent socket" in problems[str(small_tmpfs / "agent.sock")]
        _, health = router.from_client(f"{MGMT_URL}/v1/health/management")
        assert health["listeners"]["unix"]["state"] == "failed"
        assert health["listeners"]["tcp"]["state"] == "serving"
    assert proc.poll() is None


# -- 2. one agent per state directory ---------------------------------------------------
def test_a_second_agent_is_refused_and_the_first_keeps_its_socket_and_port(
    router_with_client: Router,
) -> None:
    router = router_with_client
    config = router.write("desired.yaml", base_document())
    first = router.start_agent("--config", str(config))
    pid = router.api("/v1/status")["agent"]["pid"]
    socket_inode = (router.state_dir / "agent.sock").stat().st_ino

    second = router.trueup("agent", "run", "--config", str(config), timeout=60)
    assert second.returncode == 1
    assert (
        f"another agent (pid {pid}) runs on {router.state_dir}; it keeps its socket and port"
        in second.stderr
    ), second.stderr
    assert (router.state_dir / "agent.sock").stat().st_ino == socket_inode
    assert router.api("/v1/health/management")["ready"] is True
    assert _health_from_client(router) == 200
    assert first.poll() is None


# -- 3. console recovery -----------------------------------------------------------------
class AddressWatch:
    """`ip monitor address` in the router's namespace: when an address first appeared."""

    def __init__(self, router: Router, address: str) -> None:
        self.address = address.split("/")[0]
        self.seen = threading.Event()
        self.at: float | None = None
        self.proc = subprocess.Popen(
            ["ip", "-n", router.name, "monitor", "address"],
            stdout=subprocess.PIPE,
            text=True,
        )
        router.helpers.append(self.proc)
        threading.Thread(target=self._read, daemon=True).start()
        time.sleep(0.2)  # the monitor subscribes before anything changes

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if f"inet {self.address}/" in line and not line.startswith("Deleted"):
                self.at = time.monotonic()
                self.seen.set()
                return


def _hung_writer(router: Router) -> subprocess.Popen[str]:
    """A process that takes the writer lock and never lets go."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from trueup.journal.lock import WriterLock\n"
        "WriterLock(Path(sys.argv[1]) / 'lock', 'apply (hung)').__enter__()\n"
        "print('locked', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(router.state_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    router.helpers.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _audit(router: Router, event: str) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


@pytest.mark.parametrize("writer", ["stopped", "hung"])
def test_management_set_works_without_the_agent_and_the_next_start_adopts_it(
    router_with_client: Router, template: Path, writer: str
) -> None:
    router = router_with_client
    token = _install(template, router)
    hung = _hung_writer(router) if writer == "hung" else None
    watch = AddressWatch(router, NEW_ADDRESS)
    started = time.monotonic()
    result = router.trueup(
        "management", "set", "--interface", "mgmt0", "--address", NEW_ADDRESS,
        "--gateway", "198.51.100.1", "--reason", "console test",
    )  # fmt: skip
    assert watch.seen.wait(120), result.stderr
    assert watch.at is not None
    took = watch.at - started
    print(f"management set ({writer} writer): address on the kernel after {took:.3f}s")
    assert result.returncode == 0, result.stderr
    assert router.addresses("mgmt0") == [NEW_ADDRESS]
    assert "198.51.100.1" in " ".join(router.routes("main"))
    (line,) = _audit(router, "management_set")
    assert line["details"]["addresses"] == [NEW_ADDRESS]
    if hung is not None:
        assert line["details"]["writer_lock"].startswith("bypassed")
        assert "bypassed" in result.stderr
        hung.kill()
        hung.wait()
    else:
        assert line["details"]["writer_lock"] == "held"

    show = router.trueup("management", "show")
    assert "management-override.json" in show.stdout and NEW_ADDRESS in show.stdout

    # The next start brings the override up first, keeps it, and reports it.
    router.ip("addr", "flush", "dev", "mgmt0")
    proc = router.start_agent(wait_ready=False)
    new_url = f"http://{NEW_ADDRESS.split('/')[0]}:7443"
    router.wait_for(
        lambda: _health_from_client(router, new_url) == 200,
        what="management on the override's address",
        timeout=60,
        proc=proc,
    )
    router.wait_for(router.started, what="startup phases done", proc=proc)
    assert router.addresses("mgmt0") == [NEW_ADDRESS]
    code, status = router.from_client(f"{new_url}/v1/status", token)
    assert code == 200
    assert status["management"]["override"]["addresses"] == [NEW_ADDRESS]
    skew = [f for f in status["reason_codes"] if f["subsystem"] == "management"]
    assert skew and skew[0]["code"] == "STATE_VERSION_SKEW"

    # A revision that carries the facts clears the override and its finding.
    document = base_document(interfaces=LAN)
    document["spec"]["management"]["addresses"] = [NEW_ADDRESS]
    applied = router.trueup("apply", str(router.write("v3.yaml", document)))
    assert applied.returncode == 0, applied.stderr
    assert not (router.state_dir / "management-override.json").exists()
    assert _audit(router, "management_override_cleared")
    status = router.api("/v1/status")
    assert status["management"]["override"] is None
    assert not [f for f in status["reason_codes"] if f["subsystem"] == "management"]


# -- 4. a link, a directory or a FIFO in place of a state or run file -------------------------
# What stands in place of each file: the names in one group are independent (none stops the
# others from being used), so one agent start covers the group. The first group blocks
# writes (no apply, so no daemon starts); the second does not, and the agent starts HAProxy,
# whose run directory holds the rest.
BLOCKING = ["lock", "journal.jsonl", "audit.jsonl", "applied.json", "pending-confirm.json"]
OTHERS = [
    "agent.pid",
    "agent.log",
    "management.json",
    "audit.head",
    "fences/dhcp.json",
    "secrets/web-key",
    "run/haproxy/haproxy.log",
    "run/haproxy/haproxy.pid",
    "run/haproxy/haproxy.cfg",
    "run/haproxy/state.json",
]
# Directories linked out of the state directory (to a victim directory).
LINKED_DIRECTORIES = ["run/haproxy", "fences", "secrets"]
PROXY = {
    "name": "web",
    "bind": "198.51.100.2:8080",
    "mode": "http",
    "backend": {"servers": [{"name": "app1", "address": "203.0.113.10:8080"}]},
}


@pytest.fixture(scope="module")
def proxy_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A committed revision with a proxy (so `run/haproxy/` exists), a secret and a token."""
    require_root()
    workdir = tmp_path_factory.mktemp("ptpl")
    router = Router(workdir)
    try:
        secret = workdir / "web-key.txt"
        secret.write_text("not-really-a-key\n")
        stored = router.trueup("secret", "set", "web-key", "--from-file", str(secret))
        assert stored.returncode == 0, stored.stderr
        document = base_document(interfaces=LAN, proxies=[PROXY])
        applied = router.trueup("apply", str(router.write("v1.yaml", document)))
        assert applied.returncode == 0, applied.stderr
        token = router.trueup("agent", "token", "--name", "test")
        assert token.returncode == 0, token.stderr
        (workdir / "token").write_text(token.stdout.strip())
        (workdir / "config.yaml").write_text((workdir / "v1.yaml").read_text())
    finally:
        router.close()
    _stop_haproxy(router.state_dir)
    for leftover in ("lock", "agent.sock", "agent.pid"):
        (router.state_dir / leftover).unlink(missing_ok=True)
    assert (router.state_dir / "run" / "haproxy" / "haproxy.cfg").is_file()
    # What the agent and HAProxy left is all regular files, directories and sockets of ours.
    assert StateCheck(StateDir(router.state_dir)).damaged(deep=True) == []
    yield workdir


def _stop_haproxy(state_dir: Path) -> None:
    """Stop the HAProxy a router's agent left running, by the pid it recorded."""
    record = state_dir / "run" / "haproxy" / "haproxy.pid"
    with contextlib.suppress(OSError, ValueError, KeyError):
        pid = int(json.loads(record.read_text())["pid"])
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"haproxy"):
            os.kill(pid, signal.SIGKILL)


def _plant(state: Path, victims: Path, name: str, kind: str) -> Path | None:
    """Put a link to a victim file (returned) or a directory in place of `state/name`."""
    path = state / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_text("kept\n")
        return None
    if name in LINKED_DIRECTORIES:
        folder = victims / name.replace("/", "_")
        folder.mkdir()
        (folder / "inside").write_bytes(os.urandom(16))
        path.symlink_to(folder)
        return folder / "inside"
    victim = victims / name.replace("/", "_") / "shadow"  # alone in its directory
    victim.parent.mkdir()
    victim.write_bytes(b"root:$6$host-secret:19000:0:99999:7:::\n" + os.urandom(16).hex().encode())
    victim.chmod(0o640)
    path.symlink_to(victim)
    return victim


def _digest(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mode


def _get(router: Router, path: str) -> tuple[int, Any]:
    import httpx

    transport = httpx.HTTPTransport(uds=str(router.state_dir / "agent.sock"))
    try:
        with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
            response = client.get(path)
            return response.status_code, response.json()
    except (httpx.TransportError, ValueError):
        return 0, {}


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        ("symlink", BLOCKING),
        ("symlink", OTHERS),
        ("directory", BLOCKING),
        ("directory", OTHERS),
        ("symlink", LINKED_DIRECTORIES),
    ],
    ids=["link-blocking", "link-others", "dir-blocking", "dir-others", "linked-dirs"],
)
def test_a_link_or_directory_in_place_of_a_state_file_is_refused_and_named(
    router_with_client: Router, proxy_template: Path, kind: str, names: list[str]
) -> None:
    router = router_with_client
    if router.state_dir.exists():
        shutil.rmtree(router.state_dir)
    shutil.copytree(
        proxy_template / "state",
        router.state_dir,
        symlinks=True,
        ignore=shutil.ignore_patterns("*.sock"),  # the template's HAProxy is gone
    )
    token = (proxy_template / "token").read_text()
    victims = router.workdir / "victims"
    victims.mkdir()
    planted = {name: _plant(router.state_dir, victims, name, kind) for name in names}
    before = {name: _digest(v) for name, v in planted.items() if v is not None}
    assert router.addresses("mgmt0") == []

    config = router.workdir / "config.yaml"
    shutil.copy(proxy_template / "config.yaml", config)
    proc = router.start_agent("--config", str(config), wait_ready=False, wait_started=False)
    try:
        router.wait_for(
            lambda: _health_from_client(router) == 200,
            what="management answering from the client",
            timeout=90,
            proc=proc,
        )
        assert router.addresses("mgmt0") == ["198.51.100.2/24"]

        def named() -> set[str]:
            code, status = _get(router, "/v1/status")
            assert code in (0, 200, 503), (code, status)  # never a 500
            damaged = status.get("state_directory", {}).get("damaged", []) if code else []
            return {d["path"] for d in damaged}

        wanted = {str(router.state_dir / name) for name in names}
        router.wait_for(
            lambda: wanted <= named(),
            what=f"status naming every {kind} ({sorted(wanted - named())} missing)",
            timeout=90,
            proc=proc,
        )
        router.wait_for(router.started, what="startup phases done", timeout=120, proc=proc)
        for path in ("/v1/status", "/v1/health/services", "/v1/health/management"):
            code, body = _get(router, path)
            assert code in (200, 503), (path, code, body)
        code, status = router.from_client(f"{MGMT_URL}/v1/status", token)
        assert code == 200, status
        problems = {d["path"]: d for d in status["state_directory"]["damaged"]}
        for path in wanted:
            expected = "symbolic link" if kind == "symlink" else "directory"
            assert expected in problems[path]["problem"], problems[path]
        _, services = _get(router, "/v1/health/services")
        assert wanted <= {d["path"] for d in services["state_directory"]["damaged"]}
        if names is BLOCKING:
            assert status["state_directory"]["writes_refused"] is True
        doctor = router.trueup("doctor", timeout=120)
        assert "Traceback" not in doctor.stderr, doctor.stderr
        for path in wanted:
            assert path in doctor.stdout, doctor.stdout
        assert proc.poll() is None
    finally:
        router.stop_agents()
        _stop_haproxy(router.state_dir)
    preflight = router.trueup("preflight", timeout=120)
    assert "Traceback" not in preflight.stderr, preflight.stderr
    assert preflight.returncode == 1
    for path in wanted:
        assert path in preflight.stdout, preflight.stdout
    # Nothing outside the state directory changed, and nothing planted was replaced.
    for name, victim in planted.items():
        path = router.state_dir / name
        if victim is None:
            assert path.is_dir() and not path.is_symlink(), name
            assert (path / "inside").read_text() == "kept\n", name
        else:
            assert path.is_symlink(), name
            assert _digest(victim) == before[name], f"{victim} changed through {name}"
            assert sorted(victim.parent.iterdir()) == [victim], f"written through {name}"
