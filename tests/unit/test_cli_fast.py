"""The CLI's fast path against a fake agent: argument handling, and the same output as typer.

The fake agent is a small HTTP server on a unix socket in a temporary state
directory serving canned `/v1/status`, `/v1/drift`, … answers: the system
seam the CLI talks across. Each hot command runs twice — through
`trueup.cli.fast` and through the typer command in `trueup.cli.main` — and
both must print the same bytes with the same exit code.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from tests.routers import REPO, base_document
from trueup.agent.client import AgentClient, AgentUnavailable
from trueup.cli import entry, fast, helptext
from trueup.cli.output import REFUSAL_EXIT_CODES
from trueup.journal.state import StateDir
from trueup.reconcile.status import drift_report

FINDING = {
    "code": "STATE_DRIFT_DETECTED",
    "subsystem": "addresses",
    "paths": ["spec.interfaces[lan0].addresses[203.0.113.1/24]"],
    "since": "2026-11-30T10:00:00+00:00",
    "detail": "observed state differs from version 3",
    "action": "Find who changed it, then `trueup reconcile` or `trueup ack`.",
}
STATUS: dict[str, Any] = {
    "device": "edge-01",
    "observed_at": "2026-11-30T10:00:05+00:00",
    "versions": {"applied": 3, "outcome": "committed", "control_plane": 4},
    "management": {
        "ready": True,
        "interface": "mgmt0",
        "addresses": ["198.51.100.2/24"],
        "missing_addresses": [],
    },
    "subsystems": {
        "management": {"tier": "management", "health": "ok", "policy": "auto"},
        "addresses": {
            "tier": "network",
            "health": "degraded",
            "policy": "notify",
            "reason": "1 differing path",
            "breaker": "open",
            "acknowledged_until": "2026-11-30T12:00:00+00:00",
            "contested": ["203.0.113.1/24"],
            "differences": [
                {
                    "subsystem": "addresses",
                    "path": "spec.interfaces[lan0].addresses[203.0.113.1/24]",
                    "desired": "present",
                    "observed": "absent",
                }
            ],
        },
    },
    "journal": {"open": {"txn": "t-0004", "version": 4}},
    "pending_confirmation": {"version": 4, "deadline": "2026-11-30T10:05:00+00:00"},
    "agent": {"pid": 4242, "startup": [{"name": "management", "state": "done"}]},
    "reason_codes": [FINDING],
}
IN_SYNC: dict[str, Any] = {
    **STATUS,
    "subsystems": {"management": STATUS["subsystems"]["management"]},
    "reason_codes": [],
    "journal": {},
}
PLAN = {
    "changes": True,
    "plans": [
        {"subsystem": "management", "steps": [], "noop": ["management already as desired"]},
        {
            "subsystem": "addresses",
            "steps": [{"op": "add", "describe": "add 203.0.113.1/24 to lan0"}],
            "noop": [],
        },
    ],
    "management_changes": ["remove 198.51.100.3/24 from mgmt0"],
    "managed_by": "https://cp.example.invalid",
    "observed_by": {"agent_pid": 4242, "state_dir": "/var/lib/trueup", "applied_version": 3},
}
NO_CHANGES = {**PLAN, "changes": False, "plans": [PLAN["plans"][0]], "management_changes": []}

Answer = tuple[int, Any] | None  # None: close the connection without answering


class FakeAgent:
    """Canned answers by (method, path); records every request."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.answers: dict[tuple[str, str], Answer | Callable[[], Answer]] = {
            ("GET", "/v1/health/management"): (200, {"ready": True}),
            ("GET", "/v1/status"): (200, STATUS),
            ("GET", "/v1/drift"): (200, drift_report(STATUS)),
            ("POST", "/v1/plan"): (200, PLAN),
            ("POST", "/v1/confirm"): (200, {"ok": True, "message": "version 4 confirmed"}),
            ("POST", "/v1/ack"): (200, {"ok": True, "message": "addresses acknowledged"}),
        }
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                fake.requests.append(
                    {
                        "method": method,
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "body": json.loads(body) if body else None,
                    }
                )
                answer = fake.answers.get((method, url.path), (404, {"detail": "Not Found"}))
                if callable(answer):
                    answer = answer()
                if answer is None:
                    self.close_connection = True
                    return
                status, content = answer
                data = content if isinstance(content, bytes) else json.dumps(content).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_DELETE(self) -> None:
                self._answer("DELETE")

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # Kept for debugging, not printed: the output under test is captured.
                import traceback

                fake.errors.append(traceback.format_exc())

        state_dir.mkdir(parents=True, exist_ok=True)
        StateDir(state_dir).ensure()  # the agent's: it made the directory
        self.server = Server(str(state_dir / "agent.sock"), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tu-cli-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(short_dir: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(short_dir / "state")
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRUEUP_STATE_DIR", raising=False)


Outcome = tuple[int, str, str]


def _code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def fast_path(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """The fast path alone: it must answer (not hand over to typer)."""
    capsys.readouterr()
    code = fast.run(argv)
    out, err = capsys.readouterr()
    assert code is not None, f"the fast path handed {argv} over to typer"
    return code, out, err


def typer_path(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Outcome:
    """The typer command, as `trueup.cli.main:main` ran it before the fast path existed."""
    from trueup.cli import main

    monkeypatch.setattr(sys, "argv", ["trueup", *argv])
    capsys.readouterr()
    try:
        main.main()
        code = 0
    except SystemExit as exc:
        code = _code(exc)
    out, err = capsys.readouterr()
    return code, out, err


def both(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Outcome:
    fast_outcome = fast_path(argv, capsys)
    assert fast_outcome == typer_path(argv, capsys, monkeypatch)
    return fast_outcome


# -- argument handling ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["status"], {"state_dir": "/var/lib/trueup", "output": "table"}),
        (["status", "-o", "json"], {"output": "json"}),
        (["status", "-oyaml"], {"output": "yaml"}),
        (["status", "--output=json"], {"output": "json"}),
        (["status", "--output", "table", "--state-dir", "/s"], {"state_dir": "/s"}),
        (["drift", "--state-dir=/s", "-o", "json"], {"state_dir": "/s", "output": "json"}),
        (["drift", "--state-dir="], {"state_dir": ""}),
        (["confirm", "--state-dir", "/s"], {"state_dir": "/s"}),
        (["plan", "doc.yaml"], {"file": "doc.yaml", "output": "table"}),
        (["plan", "--state-dir", "/s", "doc.yaml", "-o", "json"], {"file": "doc.yaml"}),
        (
            ["ack", "--for", "2h", "addresses", "--reason", "maintenance window"],
            {"subsystem": "addresses", "for_": "2h", "reason": "maintenance window"},
        ),
    ],
)
def test_hot_commands_are_parsed_as_typer_parses_them(
    argv: list[str], expected: dict[str, str]
) -> None:
    parsed = fast.parse(argv)
    assert parsed is not None and parsed[0] == argv[0]
    assert expected.items() <= parsed[1].items()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["apply", "doc.yaml"],
        ["status", "--help"],
        ["ack", "--help"],
        ["status", "-h"],
        ["status", "--verbose"],
        ["status", "-o", "xml"],
        ["status", "-o=json"],
        ["status", "extra"],
        ["status", "--state-dir"],
        ["status", "--state-dir", "-o", "json"],
        ["status", "--state-dir", "/a", "--state-dir", "/b"],
        ["status", "--", "x"],
        ["confirm", "-o", "json"],
        ["plan"],
        ["plan", "a.yaml", "b.yaml"],
        ["plan", "-"],
        ["ack", "addresses", "--for", "2h"],
        ["ack", "--for", "2h", "--reason", "r"],
        ["ack", "addresses", "--for", "2h", "--reason", "r", "--for", "3h"],
    ],
)
def test_anything_unusual_is_left_to_typer(argv: list[str]) -> None:
    assert fast.parse(argv) is None


def test_the_state_directory_comes_from_the_option_then_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRUEUP_STATE_DIR", "/from/env")
    assert fast.parse(["status"]) == ("status", {"output": "table", "state_dir": "/from/env"})
    assert fast.parse(["status", "--state-dir", "/opt"]) == (
        "status",
        {"state_dir": "/opt", "output": "table"},
    )
    monkeypatch.setenv("TRUEUP_STATE_DIR", "")  # empty: click ignores it
    assert fast.parse(["status"]) == ("status", {"output": "table", "state_dir": "/var/lib/trueup"})


def test_constants_shared_with_the_heavy_modules_agree() -> None:
    from trueup.cli.output import PARTIAL_UPDATE
    from trueup.journal.state import DEFAULT_STATE_DIR
    from trueup.model.reasons import EXIT_CODES, ReasonCode

    assert fast.DEFAULT_STATE_DIR == DEFAULT_STATE_DIR
    assert {code.value: exit_code for code, exit_code in EXIT_CODES.items()} == REFUSAL_EXIT_CODES
    assert ReasonCode.PARTIAL_UPDATE.value == PARTIAL_UPDATE


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), (" 1.5d ", 129600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    from trueup.cli.main import parse_duration

    assert fast.duration_seconds(text) == parse_duration(text) == seconds
    assert fast.duration_seconds("2 weeks") is None


# -- no agent, or not the agent we expected: typer decides ----------------------------------


def test_without_an_agent_the_fast_path_hands_over(short_dir: Path) -> None:
    assert fast.run(["status", "--state-dir", str(short_dir)]) is None
    # A socket file nobody listens on (an agent that died) is no agent either.
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(short_dir / "agent.sock"))
    stale.close()
    assert fast.run(["drift", "--state-dir", str(short_dir)]) is None
    assert fast.run(["confirm", "--state-dir", str(short_dir)]) is None


def test_an_unexpected_answer_hands_over_before_anything_is_printed(
    agent: FakeAgent, capsys: pytest.CaptureFixture[str], short_dir: Path
) -> None:
    state = str(agent.state_dir)
    agent.answers[("GET", "/v1/status")] = (500, {"ok": False, "message": "boom"})
    agent.answers[("GET", "/v1/drift")] = (200, b"not json")
    document = short_dir / "doc.yaml"
    document.write_text(yaml.safe_dump(base_document()))
    agent.answers[("POST", "/v1/plan")] = (422, {"message": "invalid", "problems": ["x: y"]})
    assert fast.run(["status", "--state-dir", state]) is None
    assert fast.run(["drift", "--state-dir", state]) is None
    assert fast.run(["plan", str(document), "--state-dir", state]) is None
    assert fast.run(["plan", str(short_dir / "missing.yaml"), "--state-dir", state]) is None
    assert fast.run(["ack", "addresses", "--for", "soon", "--reason", "r"]) is None
    assert capsys.readouterr() == ("", "")


def test_reads_go_straight_to_their_route_and_writes_ask_first(agent: FakeAgent) -> None:
    state = str(agent.state_dir)
    assert fast.run(["status", "--state-dir", state, "-o", "json"]) == 0
    assert fast.run(["confirm", "--state-dir", state]) == 0
    assert [r["path"] for r in agent.requests] == [
        "/v1/status",
        "/v1/health/management",
        "/v1/confirm",
    ]


def test_a_read_the_agent_does_not_answer_in_time_is_left_to_typer(
    agent: FakeAgent, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def slow() -> Answer:
        time.sleep(0.5)
        return (200, STATUS)

    agent.answers[("GET", "/v1/status")] = slow
    monkeypatch.setattr(fast, "HEALTH_TIMEOUT", 0.1)
    assert fast.run(["status", "--state-dir", str(agent.state_dir)]) is None
    assert capsys.readouterr() == ("", "")


# -- the same output as the typer commands -------------------------------------------------


@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_status_renders_as_typer_renders_it(
    agent: FakeAgent,
    output: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = both(
        ["status", "--state-dir", str(agent.state_dir), "-o", output], capsys, monkeypatch
    )
    assert code == 0 and err == ""
    assert "edge-01" in out and "STATE_DRIFT_DETECTED" in out


def test_status_reads_the_state_directory_from_the_environment(
    agent: FakeAgent, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUEUP_STATE_DIR", str(agent.state_dir))
    code, out, _ = both(["status"], capsys, monkeypatch)
    assert code == 0 and out.startswith("device:      edge-01\n")


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("status", [STATUS, IN_SYNC], ids=["drift", "in-sync"])
def test_drift_renders_as_typer_renders_it(
    agent: FakeAgent,
    output: str,
    status: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("GET", "/v1/status")] = (200, status)
    agent.answers[("GET", "/v1/drift")] = (200, drift_report(status))
    code, out, _ = both(
        ["drift", "--state-dir", str(agent.state_dir), "-o", output], capsys, monkeypatch
    )
    assert code == (2 if status is STATUS else 0)
    assert out


@pytest.mark.parametrize("output", ["table", "json"])
@pytest.mark.parametrize("plan", [PLAN, NO_CHANGES], ids=["changes", "no-changes"])
def test_plan_renders_as_typer_renders_it(
    agent: FakeAgent,
    short_dir: Path,
    output: str,
    plan: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = short_dir / "doc.yaml"
    document.write_text(yaml.safe_dump(base_document()))
    agent.answers[("POST", "/v1/plan")] = (200, plan)
    argv = ["plan", str(document), "--state-dir", str(agent.state_dir), "-o", output]
    code, out, err = both(argv, capsys, monkeypatch)
    assert code == (2 if plan is PLAN else 0)
    if output == "table" and plan is PLAN:
        assert "apply with --confirm-within" in err and "+ add 203.0.113.1/24 to lan0" in out
    fast_body, typer_body = (r["body"] for r in agent.calls("/v1/plan"))
    assert fast_body == base_document()  # as decoded from the file; the agent validates it
    assert typer_body["metadata"]["device"] == "edge-01"


def test_plan_for_another_device_is_refused_as_typer_refuses_it(
    agent: FakeAgent,
    short_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = agent.state_dir / "state.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "device": "edge-01"}))
    other = base_document()
    other["metadata"]["device"] = "edge-02"
    document = short_dir / "other.yaml"
    document.write_text(yaml.safe_dump(other))
    argv = ["plan", str(document), "--state-dir", str(agent.state_dir)]
    assert fast.run(argv) is None  # handed over: the fast path cannot plan it
    assert agent.calls("/v1/plan") == []
    code, _out, err = typer_path(argv, capsys, monkeypatch)
    assert code == 1 and "belongs to device edge-01; the document is for edge-02" in err
    own = short_dir / "own.yaml"
    own.write_text(yaml.safe_dump(base_document()))
    assert fast.run(["plan", str(own), "--state-dir", str(agent.state_dir)]) is not None


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"ok": True, "message": "version 4 confirmed"}),
        (200, {"ok": False, "message": "nothing to confirm"}),
        (200, {"ok": True}),
        (409, {"code": "STATE_CONCURRENT_MODIFICATION", "message": "another writer"}),
        (507, {"ok": False, "message": "state directory full"}),
        (500, b"<html>oops</html>"),
    ],
    ids=["confirmed", "not-ok", "no-message", "refused", "storage", "not-json"],
)
def test_confirm_answers_as_typer_answers(
    agent: FakeAgent,
    answer: Answer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("POST", "/v1/confirm")] = answer
    code, out, err = both(["confirm", "--state-dir", str(agent.state_dir)], capsys, monkeypatch)
    assert answer is not None
    status, body = answer
    expected = {409: 3}.get(status, 0 if status == 200 and body.get("ok") is not False else 1)
    assert code == expected and (out or err)


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"ok": True, "message": "addresses acknowledged until 12:00"}),
        (404, {"detail": "unknown subsystem 'nope'"}),
    ],
    ids=["acknowledged", "unknown-subsystem"],
)
def test_ack_answers_and_asks_as_typer_does(
    agent: FakeAgent,
    answer: Answer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("POST", "/v1/ack")] = answer
    argv = [
        "ack",
        "addresses",
        "--for",
        "90m",
        "--reason",
        "maintenance: lan0 & wan",
        "--state-dir",
    ]
    code, _, _ = both([*argv, str(agent.state_dir)], capsys, monkeypatch)
    assert code == (0 if answer and answer[0] == 200 else 1)
    fast_call, typer_call = agent.calls("/v1/ack")
    assert (
        fast_call["query"]
        == typer_call["query"]
        == {
            "subsystem": ["addresses"],
            "seconds": ["5400.0"],
            "reason": ["maintenance: lan0 & wan"],
            "actor": [f"cli:{os.getuid()}"],
        }
    )


# -- an agent that dies in the middle of a call ----------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["confirm"], ["ack", "addresses", "--for", "1h", "--reason", "r"]],
    ids=["confirm", "ack"],
)
def test_an_agent_dying_mid_call_is_one_line_and_exit_1(
    agent: FakeAgent,
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("POST", "/v1/confirm")] = None
    agent.answers[("POST", "/v1/ack")] = None
    full = [*argv, "--state-dir", str(agent.state_dir)]
    for outcome in (fast_path(full, capsys), typer_path(full, capsys, monkeypatch)):
        code, out, err = outcome
        assert code == 1 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "stopped answering" in err and "trueup status --state-dir" in err


def test_a_read_while_the_agent_dies_falls_back_to_the_state_directory(
    agent: FakeAgent, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent.answers[("GET", "/v1/status")] = None
    assert fast.run(["status", "--state-dir", str(agent.state_dir)]) is None
    code, out, _ = typer_path(["status", "--state-dir", str(agent.state_dir)], capsys, monkeypatch)
    assert code == 0 and "nothing applied" in out  # gathered from the (empty) state directory


def test_the_client_reports_an_agent_that_stops_answering(agent: FakeAgent) -> None:
    client = AgentClient.connect(agent.state_dir)
    assert client is not None
    agent.stop()
    with pytest.raises(AgentUnavailable) as caught:
        client.request("GET", "/v1/status")
    line = caught.value.next_step()
    assert "\n" not in line and "stopped answering" in line and "is it running?" in line
    assert f"trueup status --state-dir {agent.state_dir}" in line


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"a":\r\n3;x=y\r\n 1}\r\n0\r\n\r\n',
        b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"a": 1}',
        b'HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n{"a": 1}trailing',
    ],
    ids=["chunked", "until-close", "content-length"],
)
def test_the_client_reads_every_http_framing(short_dir: Path, raw: bytes) -> None:
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(short_dir / "agent.sock"))
    server.listen(1)

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(raw)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        client = AgentClient.at(short_dir)
        assert client is not None
        response = client.request("GET", "/v1/status", params={"flag": True, "n": None})
        assert response.status_code == 200 and response.json() == {"a": 1}
    finally:
        thread.join(5)
        server.close()


def _serve_raw(path: Path, answers: list[bytes]) -> threading.Thread:
    """A unix socket that answers one connection per entry of `answers`, in order."""
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(len(answers))

    def answer() -> None:
        with server:
            for raw in answers:
                connection, _ = server.accept()
                with connection:
                    connection.recv(65536)
                    connection.sendall(raw)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_the_client_waits_while_the_agent_is_starting(short_dir: Path) -> None:
    # The early responder answers 503 "agent starting; retry" with Retry-After
    # until the full agent takes the socket over; the request is sent again.
    starting = b'{"message": "agent starting; retry"}'
    head = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 0\r\ncontent-length: "
    early = head + str(len(starting)).encode() + b"\r\n\r\n" + starting
    ready = b'HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n{"a": 1}'
    thread = _serve_raw(short_dir / "agent.sock", [early, early, ready])
    client = AgentClient.at(short_dir)
    assert client is not None
    response = client.request("POST", "/v1/confirm")
    thread.join(5)
    assert response.status_code == 200 and response.json() == {"a": 1}


def test_any_other_503_is_the_answer(short_dir: Path) -> None:
    # A 503 from the full agent (management not ready, say) is not retried.
    body = b'{"ready": false, "reason": "address missing"}'
    head = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 0\r\ncontent-length: "
    answer = head + str(len(body)).encode() + b"\r\n\r\n" + body
    thread = _serve_raw(short_dir / "agent.sock", [answer])
    client = AgentClient.at(short_dir)
    assert client is not None
    response = client.request("GET", "/v1/health/management")
    thread.join(5)
    assert response.status_code == 503 and response.json()["ready"] is False


# -- what the fast path imports ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["drift", "-o", "json"],
        ["confirm"],
        ["ack", "addresses", "--for", "1h", "--reason", "r"],
    ],
)
def test_the_fast_path_imports_nothing_heavy(agent: FakeAgent, argv: list[str]) -> None:
    script = (
        "import sys\n"
        "from trueup.cli import fast\n"
        "code = fast.run(sys.argv[1:])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'typer', 'click', 'rich', 'pydantic', 'httpx', 'yaml', 'fastapi', 'pyroute2'})\n"
        "trueup = sorted(m for m in sys.modules if m.startswith('trueup.'))\n"
        "print(repr((code, heavy, trueup)), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv, "--state-dir", str(agent.state_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=60,
    )
    code, heavy, modules = eval(proc.stderr.strip().splitlines()[-1])
    assert code is not None and heavy == []
    assert modules == [
        "trueup.agent",
        "trueup.agent.client",
        "trueup.cli",
        "trueup.cli.agentdevice",
        "trueup.cli.commands",
        "trueup.cli.fast",
        "trueup.cli.output",
        "trueup.cli.statusreports",
        "trueup.cli.statustable",
    ]


# -- the console entry ------------------------------------------------------------------------


def test_agent_run_goes_to_the_fast_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class FastBoot:
        @staticmethod
        def boot(argv: list[str]) -> int:
            seen.append(argv)
            return 7

    monkeypatch.setitem(sys.modules, "trueup.agent.fastboot", FastBoot)
    with pytest.raises(SystemExit) as caught:
        entry.main(["agent", "run", "--state-dir", "/s"])
    assert caught.value.code == 7 and seen == [["--state-dir", "/s"]]


# -- trueup --help --------------------------------------------------------------------------


@functools.cache
def _typer_command() -> Any:
    import typer

    from trueup.cli.main import app

    return typer.main.get_command(app)


def _typer_help(width: int, colour: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `trueup --help` prints through typer, on a console this wide, in colour or not."""
    import typer.rich_utils as ru

    monkeypatch.setattr(ru, "MAX_WIDTH", width)
    monkeypatch.setattr(ru, "FORCE_TERMINAL", colour)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        _typer_command().main(["--help"], prog_name="trueup")
    return buffer.getvalue()


def test_the_help_text_is_generated_from_todays_typer_app() -> None:
    from trueup.cli import helpgen

    assert helpgen.generate() == helptext.HELP, (
        "the CLI changed: run `.venv/bin/python -m trueup.cli.helpgen --write`"
    )


# Every width where a line can wrap (today the longest help line fits from 113
# columns on), then wide terminals up to the widest the fast path renders.
WRAPPING = range(helptext.MIN_WIDTH, 124)
WIDE = [*range(124, helptext.MAX_WIDTH, 11), helptext.MAX_WIDTH]


@pytest.mark.parametrize("colour", [False, True], ids=["plain", "colour"])
def test_help_renders_as_typer_at_every_width(
    colour: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for width in [*WRAPPING, *WIDE]:
        assert helptext.render(width, colour) == _typer_help(width, colour, monkeypatch), width


def test_no_line_wraps_beyond_the_widths_compared_one_by_one() -> None:
    widest = helptext.render(helptext.MAX_WIDTH, False)
    assert widest is not None
    for width in (WRAPPING[-1], helptext.MAX_WIDTH):
        text = helptext.render(width, False)
        assert text is not None and text.count("\n") == widest.count("\n")


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_help_uses_the_width_and_colour_rich_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((132, 40)))
    assert helptext.console_setup({}, _Stream(tty=True)) == (132, True)
    assert helptext.console_setup({"COLUMNS": "90"}, _Stream(tty=False)) == (90, False)
    assert helptext.console_setup({"COLUMNS": "x"}, _Stream(tty=False)) == (132, False)
    assert helptext.console_setup({"COLUMNS": "20"}, _Stream(tty=False)) is None
    assert helptext.console_setup({"NO_COLOR": "1"}, _Stream(tty=True)) is None
    assert helptext.console_setup({"FORCE_COLOR": "1"}, _Stream(tty=False)) is None
    assert helptext.console_setup({"TERM": "dumb"}, _Stream(tty=True)) is None

    def no_terminal(fd: int) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert helptext.console_setup({}, _Stream(tty=False)) == (80, False)


def test_help_end_to_end_is_typers(tmp_path: Path) -> None:
    """`trueup --help` through the console entry (the fast path) and through typer."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "NO_COLOR")}
    env |= {"PYTHONPATH": str(REPO), "COLUMNS": "97"}
    script = tmp_path / "trueup"
    script.write_text(
        "import sys\nfrom trueup.cli.entry import main\n"
        "try:\n    main()\nfinally:\n    print('typer' in sys.modules, file=sys.stderr)\n"
    )
    fast_run = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    script.write_text("import sys\nfrom trueup.cli.main import main\nmain()\n")
    typer_run = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert (fast_run.returncode, fast_run.stdout) == (typer_run.returncode, typer_run.stdout)
    assert fast_run.returncode == 0 and "│ status " in fast_run.stdout
    assert fast_run.stderr == "False\n"  # answered without importing typer
