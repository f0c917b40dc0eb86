"""One write path: who may change the router, read from the code and held to the docs.

A write is a call through the system seam (`Sources`: netlink, files, nft,
daemons, runner, the announcer), a subsystem's `execute`, a converge of the
engine, or the DHCP fence hook. Subsystems write (in `execute`, called by the
one converge); the engine converges; every other module that writes is a row
of "Who else writes to the system" in docs/architecture.md, with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "trueup"
DOCS = REPO / "docs" / "architecture.md"
SECTION = "### Who else writes to the system"

NETLINK_WRITES = {"set_link", "add_address", "del_address", "add_route", "del_route"}
DAEMON_WRITES = {"ensure", "stop", "restart", "signal"}
FILE_WRITES = {"write", "remove", "write_private", "remove_private", "replace_private"}
# The engine's ways in (trueup.reconcile.engine.converge) and the DHCP fence hook.
ENTRIES = {
    "converge",
    "converge_bounded",
    "converge_management",
    "converge_gateways",
    "follow_fence",
}

# The seam itself, the subsystems that write through it, and the engine that runs them.
DESIGNED = ("trueup/system/", "trueup/subsystems/", "trueup/reconcile/engine/")


def _chain(node: ast.expr) -> list[str]:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def writes_in(source: str) -> set[str]:
    """What `source` calls that changes the system, as `receiver.method` names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in ENTRIES:
            found.add(node.func.id)
            continue
        if not isinstance(node.func, ast.Attribute):
            continue
        *receiver, method = _chain(node.func) or ["", node.func.attr]
        if method in ENTRIES:
            found.add(method)
        elif method in NETLINK_WRITES:
            found.add(f"netlink.{method}")
        elif method in DAEMON_WRITES and any("daemon" in r for r in receiver):
            found.add(f"daemons.{method}")
        elif method in FILE_WRITES and "files" in receiver:
            found.add(f"files.{method}")
        elif method == "run" and ({"nft", "nftables", "runner"} & set(receiver)):
            found.add(f"{receiver[-1]}.run")
        elif method == "announce":
            found.add("announce")
        elif method == "execute" and receiver and receiver[-1] in ("sub", "subsystem"):
            found.add("subsystem.execute")
    return found


def _writers() -> dict[str, set[str]]:
    writers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(REPO))
        if name.startswith(DESIGNED) or name.startswith("trueup/server/"):
            continue  # the control plane runs nowhere near a router's system
        if found := writes_in(path.read_text()):
            writers[name] = found
    return writers


def _documented() -> set[str]:
    text = DOCS.read_text()
    assert SECTION in text, f"{DOCS.name} lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `(trueup/[^`]+\.py)` \|", section, re.MULTILINE))


def test_every_writer_outside_the_engine_is_documented_with_why() -> None:
    writers = _writers()
    documented = _documented()
    undocumented = {m: sorted(w) for m, w in writers.items() if m not in documented}
    assert not undocumented, (
        "these modules write to the system outside trueup.reconcile.engine: go through "
        f"Engine.transact, or add them with why to {SECTION!r} in docs/architecture.md: "
        f"{undocumented}"
    )
    stale = sorted(documented - writers.keys())
    assert not stale, f"documented as writers but no longer writing (remove their rows): {stale}"


def test_only_the_one_converge_runs_a_subsystems_steps() -> None:
    callers = sorted(
        str(p.relative_to(REPO))
        for p in PACKAGE.rglob("*.py")
        if "subsystem.execute" in writes_in(p.read_text())
    )
    assert callers == ["trueup/reconcile/engine/converge.py"]


def test_the_scan_sees_each_kind_of_write() -> None:
    source = """
def f(sources, net, engine, sub):
    sources.netlink.add_address("eth0", "192.0.2.1/24")
    net.daemons.stop("kea-dhcp4")
    sources.files.write_private("run/x", "")
    sources.nft.run("flush ruleset")
    sources.runner.run(["wg", "set"])
    sources.announcer.announce("eth0", "192.0.2.1/24")
    sub.execute(net, step)
    converge_management(net, engine)
    fence_follower("dhcp").follow_fence(engine)
    sources.netlink.links()
    sources.files.read("x")
    conn.execute("select 1")
"""
    assert writes_in(source) == {
        "netlink.add_address",
        "daemons.stop",
        "files.write_private",
        "nft.run",
        "runner.run",
        "announce",
        "subsystem.execute",
        "converge_management",
        "follow_fence",
    }
