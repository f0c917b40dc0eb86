"""The CLI's fast path against a real agent in a namespace: the same output as the typer commands.

Every hot command (`status`, `drift`, `plan`, `confirm`, `ack`) runs twice —
through the console entry (`trueup.cli.entry`, which answers without
importing typer) and through the typer CLI (`trueup.cli.main`) — and both
must print the same lines with the same exit code. The fast run also reports
whether it imported typer, so a silent fall back to the full CLI is seen.
"""

from __future__ import annotations

import difflib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

LAN = "203.0.113.1/24"
_FAST = (
    "import sys\n"
    "sys.argv[0] = 'trueup'\n"
    "from trueup.cli.entry import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('typer imported:', 'typer' in sys.modules, file=sys.stderr)\n"
)
_TYPER = "import sys\nsys.argv[0] = 'trueup'\nfrom trueup.cli.main import main\nmain()\n"
# Values that legitimately differ between two calls a moment apart: when status
# was observed, and the reconcile loop's clock and counters (periodic watches
# — Kea, Knot — wake it between the two calls).
_VOLATILE = re.compile(
    r"(\"?(?:observed_at|last_pass_at|last_resync_at|last_event_at)\"?: )[\"']?[0-9T:.Z+-]+[\"']?"
)
_COUNTERS = re.compile(r"(\"?(?:passes|events|ticks)\"?: )[0-9]+")
# Ages printed against the clock ("drifting since 13:19:20Z (1 s ago)") tick
# over between the two calls.
_AGES = re.compile(r"\((?:[0-9]+ [a-z]+ )+ago\)")


def _normalise(text: str) -> str:
    text = _COUNTERS.sub(r"\1<n>", _VOLATILE.sub(r"\1<time>", text))
    return _AGES.sub("(<age> ago)", text)


def _run(router: Router, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return router.run(sys.executable, "-c", script, *args, "--state-dir", str(router.state_dir))


def both(router: Router, *args: str, fast: bool = True) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the fast path, after checking typer prints the same."""
    quick = _run(router, _FAST, *args)
    *errors, marker = quick.stderr.splitlines(keepends=True) or [""]
    assert marker.strip() == f"typer imported: {not fast}", (args, quick.stderr)
    full = _run(router, _TYPER, *args)
    fast_outcome = (quick.returncode, _normalise(quick.stdout), _normalise("".join(errors)))
    full_outcome = (full.returncode, _normalise(full.stdout), _normalise(full.stderr))
    assert fast_outcome == full_outcome, "".join(
        difflib.unified_diff(
            fast_outcome[1].splitlines(keepends=True),
            full_outcome[1].splitlines(keepends=True),
            "fast path",
            "typer",
        )
    )
    return fast_outcome


@pytest.fixture
def agent(router: Router) -> Router:
    document = base_document(convergence={"default": "notify"})
    applied = router.trueup("apply", str(router.write("desired.yaml", document)))
    assert applied.returncode == 0, applied.stderr
    router.start_agent()
    return router


def _document(**spec: Any) -> dict[str, Any]:
    return base_document(convergence={"default": "notify"}, **spec)


def test_hot_commands_print_what_typer_prints(agent: Router) -> None:
    router = agent
    for output in ("table", "json", "yaml"):
        code, out, err = both(router, "status", "-o", output)
        assert code == 0 and "edge-01" in out and err == ""
        code, out, _ = both(router, "drift", "-o", output)
        assert code == 0 and out

    same = router.write("same.yaml", _document())
    code, out, _ = both(router, "plan", str(same))
    assert code == 0 and out.startswith("observed by the agent") and "no changes" in out
    more = _document(
        interfaces=[{"name": "lan0", "mtu": 1400, "addresses": [LAN, "203.0.113.9/24"]}]
    )
    as_json = router.workdir / "more.json"
    as_json.write_text(json.dumps(more))
    code, out, _ = both(router, "plan", str(as_json), "-o", "json")
    assert code == 2 and "203.0.113.9/24" in out
    code, out, _ = both(router, "plan", str(router.write("more.yaml", more)))
    assert code == 2 and "change(s)" in out and "203.0.113.9/24" in out

    code, out, _ = both(router, "confirm")
    assert code in (0, 1) and out  # nothing pending: the agent says so

    # Drift under `notify`: reported, not healed.
    router.ip("addr", "del", LAN, "dev", "lan0")
    router.wait_for(lambda: router.api("/v1/drift").get("in_sync") is False, what="drift reported")
    code, out, _ = both(router, "drift")
    assert code == 2 and "STATE_DRIFT_DETECTED" in out
    code, out, _ = both(router, "status")
    assert code == 0 and "STATE_DRIFT_DETECTED" in out

    code, out, err = both(router, "ack", "nosuch", "--for", "1h", "--reason", "test")
    assert code == 1 and "nosuch" in err


def test_ack_through_either_path_acknowledges_the_same_way(agent: Router) -> None:
    router = agent
    quick = _run(router, _FAST, "ack", "addresses", "--for", "2h", "--reason", "maintenance")
    full = _run(router, _TYPER, "ack", "addresses", "--for", "2h", "--reason", "maintenance")
    assert quick.returncode == full.returncode == 0, (quick.stderr, full.stderr)
    assert quick.stderr.strip() == "typer imported: False" and full.stderr == ""
    stamp = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:\d\d)?")
    assert stamp.sub("<t>", quick.stdout) == stamp.sub("<t>", full.stdout)
    acked = router.api("/v1/status")["subsystems"]["addresses"]
    assert acked.get("acknowledged_until")


def test_invalid_documents_and_missing_files_are_typers_business(agent: Router) -> None:
    router = agent
    broken = _document()
    broken["spec"]["interfaces"][0]["addresses"] = ["not-a-prefix"]
    code, _, err = both(router, "plan", str(router.write("broken.yaml", broken)), fast=False)
    assert code == 1 and "broken.yaml: invalid document" in err
    code, _, err = both(router, "plan", str(router.workdir / "missing.yaml"), fast=False)
    assert code == 1 and "missing.yaml" in err
    code, _, _ = both(router, "status", "--help", fast=False)
    assert code == 0
    code, _, _ = both(router, "ack", "addresses", "--for", "soon", "--reason", "x", fast=False)
    assert code == 2


def test_without_an_agent_the_commands_work_as_before(agent: Router) -> None:
    router = agent
    router.stop_agents(signal.SIGKILL)  # the socket file stays behind
    assert (router.state_dir / "agent.sock").exists()
    code, out, _ = both(router, "status", fast=False)
    assert code == 0 and "applied:     version 1" in out
    code, _, err = both(router, "confirm", fast=False)
    assert code == 1 and "no agent answers" in err


def test_help_is_typers(router: Router, tmp_path: Path) -> None:
    script = tmp_path / "trueup"
    script.write_text(_FAST)
    quick = router.run(sys.executable, str(script), "--help")
    full = router.run(sys.executable, "-c", _TYPER, "--help")
    assert quick.stderr == "typer imported: False\n"
    assert (quick.returncode, quick.stdout) == (full.returncode, full.stdout)
