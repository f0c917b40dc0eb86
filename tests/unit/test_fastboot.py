"""The fast path without a kernel: options, which facts it trusts, the responder's handover."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trueup.agent import fastboot
from trueup.agent.early import EarlyResponder, bind_unix
from trueup.agent.fastboot import UsageError, parse_agent_run
from trueup.journal.management import MANAGEMENT_FILE, boot_facts, write_management

FACTS: dict[str, Any] = {
    "interface": "mgmt0",
    "addresses": ["198.51.100.2/24"],
    "gateway": None,
    "api": {"port": 7443, "bind": None},
    "version": 2,
    "digest": "sha256:two",
}


# -- options ----------------------------------------------------------------------
def test_options_as_typer_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRUEUP_STATE_DIR", raising=False)
    argv = "--config c.yaml --state-dir=/s --listen-port 8443 --plugin a:B --plugin=c:D"
    argv += " --control-plane http://cp --token-file t --management-fallback f.yaml"
    options = parse_agent_run([*argv.split(), "--log-level", "debug"])
    assert options.config == Path("c.yaml") and options.state_dir == Path("/s")
    assert options.listen_port == 8443 and options.plugins == ["a:B", "c:D"]
    assert options.control_plane == "http://cp" and options.token_file == Path("t")
    assert options.management_fallback == Path("f.yaml") and options.log_level == "debug"
    assert parse_agent_run([]).state_dir == Path("/var/lib/trueup")
    monkeypatch.setenv("TRUEUP_STATE_DIR", "/env")
    assert parse_agent_run([]).state_dir == Path("/env")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "no such option: --nope"),
        (["stray"], "unexpected stray"),
        (["--config"], "requires a value"),
        (["--listen-port", "x"], "not a number"),
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_agent_run(argv)


def test_boot_refuses_bad_options_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert fastboot.boot(["--nope"]) == 2
    assert "no such option: --nope" in capsys.readouterr().err


def test_the_fast_path_imports_nothing_heavy() -> None:
    script = (
        "import sys, trueup.agent.fastboot\n"
        "heavy = {'pydantic', 'fastapi', 'uvicorn', 'sqlalchemy', 'typer', 'httpx', 'pyroute2',"
        " 'yaml', 'starlette', 'click'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- which facts ------------------------------------------------------------------
def _write(root: Path, name: str, value: Any) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def _revision(root: Path, version: int, addresses: list[str]) -> None:
    management = {"interface": "mgmt0", "addresses": addresses, "api": {"port": 7443}}
    document = {"spec": {"management": management}}
    _write(root, f"revisions/{version:08d}.json", {"version": version, "document": document})


def test_management_json_is_used(tmp_path: Path) -> None:
    write_management(tmp_path, FACTS)
    _write(tmp_path, "applied.json", {"version": 2, "digest": "sha256:two"})
    assert boot_facts(tmp_path) == (FACTS, MANAGEMENT_FILE)


def test_nothing_to_go_on_means_the_full_path(tmp_path: Path) -> None:
    assert boot_facts(tmp_path) is None
    (tmp_path / MANAGEMENT_FILE).write_text("{torn")
    assert boot_facts(tmp_path) is None


def test_a_damaged_applied_record_does_not_count_against_the_copy(tmp_path: Path) -> None:
    write_management(tmp_path, FACTS)
    (tmp_path / "applied.json").write_bytes(b"\xff garbage")
    found = boot_facts(tmp_path)
    assert found is not None and found[0]["addresses"] == FACTS["addresses"]


def test_the_applied_revision_wins_over_a_stale_copy(tmp_path: Path) -> None:
    """A crash between the commit's applied record and management.json."""
    write_management(tmp_path, FACTS)
    _revision(tmp_path, 3, ["198.51.100.3/24"])
    _write(tmp_path, "applied.json", {"version": 3, "digest": "sha256:three"})
    found = boot_facts(tmp_path)
    assert found is not None
    facts, source = found
    assert facts["addresses"] == ["198.51.100.3/24"] and facts["version"] == 3
    assert source == "revision 3"


def test_a_console_override_is_laid_over(tmp_path: Path) -> None:
    write_management(tmp_path, {**FACTS, "api": {"port": 8443, "bind": "management"}})
    _write(tmp_path, "applied.json", {"version": 2, "digest": "sha256:two"})
    override = {"interface": "mgmt1", "addresses": ["192.0.2.5/24"], "gateway": "192.0.2.1"}
    _write(tmp_path, "management-override.json", {**override, "reason": "console"})
    found = boot_facts(tmp_path)
    assert found is not None
    facts, source = found
    assert source == "management-override.json"
    assert {k: facts[k] for k in override} == override
    assert facts["api"] == {"port": 8443, "bind": "management"}
    # a damaged override is left to phase 1 to report
    (tmp_path / "management-override.json").write_text("{torn")
    assert boot_facts(tmp_path) == (
        FACTS | {"api": {"port": 8443, "bind": "management"}},
        "management.json",
    )
    # `management set` with nothing committed: its facts and the default port
    (tmp_path / MANAGEMENT_FILE).unlink()
    (tmp_path / "applied.json").unlink()
    _write(tmp_path, "management-override.json", override)
    found = boot_facts(tmp_path)
    assert found is not None and found[0]["api"] == {"port": 7443, "bind": None}


def test_an_older_state_directory_uses_the_applied_revision(tmp_path: Path) -> None:
    _revision(tmp_path, 1, ["198.51.100.2/24"])
    _write(tmp_path, "applied.json", {"version": 1, "digest": "sha256:one"})
    found = boot_facts(tmp_path)
    assert found is not None and found[0]["digest"] == "sha256:one"


def test_an_expired_confirmation_comes_up_as_last_confirmed(tmp_path: Path) -> None:
    write_management(tmp_path, {**FACTS, "addresses": ["198.51.100.9/24"]})
    _write(tmp_path, "applied.json", {"version": 2, "digest": "sha256:two"})
    _revision(tmp_path, 1, ["198.51.100.2/24"])
    pending = {"state": "pending", "version": 2, "confirmed_version": 1, "deadline": 1.0}
    _write(tmp_path, "pending-confirm.json", pending)
    found = boot_facts(tmp_path)
    assert found is not None and found[0]["addresses"] == ["198.51.100.2/24"]
    # still waiting: the applied revision's management
    _write(tmp_path, "pending-confirm.json", {**pending, "deadline": time.time() + 600})
    found = boot_facts(tmp_path)
    assert found is not None and found[0]["addresses"] == ["198.51.100.9/24"]


# -- the responder and its handover -----------------------------------------------
def _get(path: Path, target: str = "/v1/health/management", body: bytes = b"") -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(str(path))
        method = "POST" if body else "GET"
        head = f"{method} {target} HTTP/1.1\r\nhost: a\r\ncontent-length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
        return data


def _answer(method: str, target: str) -> tuple[int, dict[str, Any]]:
    if target == "/v1/health/management":
        return 200, {"ready": True, "phase": "early", "pid": os.getpid()}
    return 503, {"message": "agent starting; retry"}


@pytest.mark.parametrize("fork", [True, False], ids=["child process", "thread"])
def test_responder_answers_then_hands_the_backlog_over(tmp_path: Path, fork: bool) -> None:
    path = tmp_path / "agent.sock"
    listener = bind_unix(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    responder = EarlyResponder(_answer, [listener])
    responder.start(fork=fork)
    assert (responder.pid is not None) is fork
    reply = _get(path)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b'"phase": "early"' in reply
    answered_by = json.loads(reply.partition(b"\r\n\r\n")[2])["pid"]
    assert (answered_by != os.getpid()) is fork
    other = _get(path, "/v1/status", body=b'{"x": 1}' * 1000)
    assert other.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1\r\n" in other

    responder.release(listener)
    # Released: a connection now waits in the backlog (not refused, not answered early) …
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting.settimeout(5)
    waiting.connect(str(path))
    waiting.sendall(b"GET /v1/health/management HTTP/1.1\r\n\r\n")
    # … until the next owner of the socket (uvicorn, in the agent) accepts it.
    listener.setblocking(True)
    accepted, _ = listener.accept()
    with accepted:
        assert accepted.recv(4096).startswith(b"GET /v1/health/management")
        accepted.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert waiting.recv(4096).startswith(b"HTTP/1.1 200 OK")
    waiting.close()
    listener.close()
    if responder.pid is not None:  # the child exits once everything is released
        deadline = time.monotonic() + 120
        while _alive(responder.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(responder.pid)


def _alive(pid: int) -> bool:
    """Running (a zombie not reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_child_leaves_when_the_agent_is_gone(tmp_path: Path) -> None:
    """End of file on the control pipe (the agent died): the child closes its listeners."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from trueup.agent.early import EarlyResponder, bind_unix\n"
        "sock = bind_unix(Path(sys.argv[1]))\n"
        "responder = EarlyResponder(lambda m, t: (200, {}), [sock])\n"
        "responder.start()\n"
        "print(responder.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    path = tmp_path / "agent.sock"
    agent = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE)
    assert agent.stdout is not None
    child = int(agent.stdout.readline())
    assert _get(path).startswith(b"HTTP/1.1 200 ")
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 120
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _alive(child):
        os.kill(child, 9)
        raise AssertionError("the early responder outlived the agent")
    with pytest.raises(OSError):  # nobody listens any more
        _get(path)


def test_releasing_an_unknown_socket_is_a_no_op() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        EarlyResponder(_answer, []).release(sock)


def test_malformed_requests_get_400(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    listener = bind_unix(path)
    responder = EarlyResponder(_answer, [listener])
    responder.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(str(path))
        conn.sendall(b"nonsense\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 400 ")
    responder.release(listener)
    listener.close()
