"""A `--state-dir` that is not the device's state directory is refused, in a real namespace.

An existing empty folder, the parent of a state directory (the demo's
`demo-state` holding `agent/`) and another device's state directory: every
command but `agent run` and `apply --init` exits 1 naming the path and what
it found; the directory's listing, the namespace's links, addresses, routes
and nftables ruleset, and its processes are the same afterwards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.routers import TRUEUP, Router, base_document, sh
from trueup.journal.state import StateDir

pytestmark = pytest.mark.root

# Every command taking --state-dir except `agent run`, `apply --init` and `preflight`.
COMMANDS = [
    ["status"],
    ["status", "-o", "json"],
    ["drift"],
    ["plan", "{doc}"],
    ["apply", "{doc}"],
    ["rollback"],
    ["reconcile"],
    ["confirm"],
    ["ack", "addresses", "--for", "1h", "--reason", "r"],
    ["evidence", "--out", "{out}/evidence.tar.gz"],
    ["doctor"],
    ["audit", "verify"],
    ["agent", "token"],
    ["backup", "create", "--out", "{out}/backup.tar"],
    ["restore", "status"],
    ["dhcp", "leases"],
    ["dhcp", "fence", "show"],
    ["dhcp", "fence", "hold", "--reason", "r"],
    ["dhcp", "fence", "lift"],
    ["secret", "list"],
    ["management", "show"],
    ["management", "set", "--interface", "mgmt0", "--address", "198.51.100.9/24"],
    ["limitation", "list"],
    ["limitation", "add", "addresses", "x", "--reason", "r", "--reviewed-by", "me"],
]
# The first steps on a new or replacement router: they take a missing or empty folder
# (`restore apply` and `secret set` make it a state directory), and refuse a parent
# folder or another device's state directory.
FIRST_STEPS = [
    ["restore", "analyze", "{archive}"],
    ["restore", "apply", "{archive}", "--mode", "config-only"],
    ["secret", "set", "k", "--from-file", "{secret}"],
]


def _listing(root: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            info = os.lstat(os.path.join(folder, name))
            rel = os.path.relpath(os.path.join(folder, name), root)
            out.append((rel, info.st_mode, info.st_size, info.st_mtime_ns))
    return sorted(out)


def _kernel(router: Router) -> dict[str, Any]:
    """Links, addresses, routes, the nftables ruleset and the processes of the namespace."""
    return {
        "links": sorted(
            (link["ifname"], link.get("mtu"), "UP" in link.get("flags", []))
            for link in router.ip_json("link", "show")
        ),
        "addresses": sorted(
            (entry["ifname"], info["local"], info["prefixlen"])
            for entry in router.ip_json("addr", "show")
            for info in entry.get("addr_info", [])
            if info.get("scope") != "link"
        ),
        "routes": sorted(
            json.dumps(route, sort_keys=True)
            for table in ("main", "100")
            for route in router.ip_json("route", "show", "table", table)
        ),
        "nft": router.run("nft", "list", "ruleset").stdout,
        "pids": sorted(sh("ip", "netns", "pids", router.name).stdout.split()),
    }


@pytest.fixture
def setup(router: Router, tmp_path: Path) -> dict[str, Any]:
    """The router's own state directory with edge-01 applied, an archive of it, the inputs."""
    doc = router.write("desired.yaml", base_document())
    applied = router.trueup("apply", str(doc))
    assert applied.returncode == 0, applied.stderr
    out = tmp_path / "out"
    out.mkdir()
    archive = out / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stderr
    secret = out / "k.txt"
    secret.write_text("value\n")
    other = base_document()
    other["metadata"]["device"] = "edge-02"
    return {
        "doc": str(doc),
        "other_doc": str(router.write("other.yaml", other)),
        "archive": str(archive),
        "secret": str(secret),
        "out": str(out / "written"),
    }


def _refused_everywhere(
    router: Router, state_dir: Path, values: dict[str, Any], expected: list[str], device: bool
) -> None:
    before, kernel = _listing(state_dir), _kernel(router)
    empty = not any(state_dir.iterdir())
    for argv in COMMANDS + ([] if empty else FIRST_STEPS):
        full = [a.format(**values) for a in argv]
        if device and "{doc}" in argv:
            # A document names its device: no option needed.
            full = [values["other_doc"] if a == values["doc"] else a for a in full]
            prefix: list[str] = []
        else:
            prefix = ["--device", "edge-02"] if device else []
        done = router.run(*TRUEUP, *prefix, *full, "--state-dir", str(state_dir))
        shown = " ".join(argv)
        assert done.returncode == 1, (shown, done.stdout, done.stderr)
        for text in expected:
            assert text in done.stderr, (shown, done.stderr)
        assert "Traceback" not in done.stderr, (shown, done.stderr)
        assert _listing(state_dir) == before, shown
        assert not Path(values["out"]).exists(), shown
    assert _kernel(router) == kernel


def test_an_empty_folder_is_refused_by_every_command(
    router: Router, setup: dict[str, Any], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    expected = [
        f"{empty} is not a trueup state directory: it is empty",
        "`trueup agent run` and `trueup apply --init` create one",
        "nothing was changed",
    ]
    _refused_everywhere(router, empty, setup, expected, device=False)
    assert list(empty.iterdir()) == []
    # A key stored before the first apply makes the directory, audited from the first write.
    keyed = tmp_path / "keyed"
    keyed.mkdir()
    stored = router.trueup(
        "secret", "set", "k", "--from-file", setup["secret"], "--state-dir", str(keyed),
        state=False,
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    assert json.loads((keyed / "state.json").read_text())["created"]["by"] == "trueup secret set"
    events = [r["event"] for r in StateDir(keyed).audit.records()]
    assert events[:1] == ["state_dir_created"] and "secret_set" in events, events
    # The commands that make a state directory make it here, with its identity.
    made = router.trueup("apply", setup["doc"], "--init", "--state-dir", str(empty), state=False)
    assert made.returncode == 0, made.stderr
    identity = json.loads((empty / "state.json").read_text())
    assert identity["device"] == "edge-01"
    assert identity["created"]["by"] == "trueup apply --init"
    assert "state_dir_created" in [r["event"] for r in StateDir(empty).audit.records()]


def test_a_parent_of_state_directories_is_refused_even_by_the_commands_that_create(
    router: Router, setup: dict[str, Any], tmp_path: Path
) -> None:
    parent = tmp_path / "demo-state"
    StateDir(parent / "agent").ensure()
    (parent / "agent.log").write_text("")
    expected = [
        f"{parent} is not a trueup state directory: it looks like a parent of state "
        f"directories: it holds agent/ (did you mean --state-dir {parent / 'agent'}?)",
    ]
    _refused_everywhere(router, parent, setup, expected, device=False)
    before, kernel = _listing(parent), _kernel(router)
    init = router.trueup("apply", setup["doc"], "--init", "--state-dir", str(parent), state=False)
    assert init.returncode == 1 and expected[0] in init.stderr, init.stderr
    agent = router.run(*TRUEUP, "agent", "run", "--state-dir", str(parent), timeout=60)
    assert agent.returncode == 1 and expected[0] in agent.stderr, agent.stderr
    assert _listing(parent) == before and _kernel(router) == kernel


def test_another_devices_state_directory_is_refused(router: Router, setup: dict[str, Any]) -> None:
    state_dir = router.state_dir
    expected = [f"state directory {state_dir} belongs to device edge-01", "edge-02"]
    _refused_everywhere(router, state_dir, setup, expected, device=True)
    before, kernel = _listing(state_dir), _kernel(router)
    other = setup["other_doc"]
    init = router.trueup("apply", other, "--init")
    assert init.returncode == 1, init.stderr
    assert "belongs to device edge-01; the document is for edge-02" in init.stderr
    agent = router.run(
        *TRUEUP, "agent", "run", "--config", other, "--state-dir", str(state_dir), timeout=60
    )
    assert agent.returncode == 1, agent.stdout + agent.stderr
    assert "belongs to device edge-01; the document is for edge-02" in agent.stderr
    assert _listing(state_dir) == before and _kernel(router) == kernel
    # TRUEUP_DEVICE works as --device does, on the fast path's commands too.
    env_status = router.trueup("status", env={"TRUEUP_DEVICE": "edge-02"})
    assert env_status.returncode == 1 and expected[0] in env_status.stderr
    own = router.trueup("--device", "edge-01", "status", "-o", "json")
    assert own.returncode == 0, own.stderr
    assert isinstance(json.loads(own.stdout), dict)
