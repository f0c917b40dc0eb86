"""What the restore state machine checks: differences, verification, the allocator.

Who calls this: `trueup.backup.restore` — `verify` in `verifying`,
`differences` to decide whether a rolled-back restore is back at its
previous revision, `assert_allocator` right after the fence is held or
lifted. Everything here reads (Kea's leases through `read_leases`: its
socket, else the memfile — never by starting or stopping Kea) except
`assert_allocator`, which tells a running Kea to follow the fence record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trueup.backup.format import LEASES
from trueup.reconcile.transaction import Engine
from trueup.system.daemon import verified_pid
from trueup.system.kea import KeaError, kea_paths
from trueup.system.kealeases import KeaSocketError, read_leases
from trueup.system.safefile import read_file

__all__ = ["assert_allocator", "differences", "verify"]


def differences(engine: Engine) -> list[str]:
    """Paths where the system differs from the applied revision (empty: it matches)."""
    document = engine.applied_document()
    if document is None:
        return []
    errors: dict[str, str] = {}
    with engine.sources() as net:
        found = engine.differences(document, net, errors=errors)
    out = [f"{name}: {d.path}" for name, diffs in found.items() for d in diffs]
    return out + [f"{name}: {why}" for name, why in errors.items()]


def verify(engine: Engine, record: dict[str, Any], staged: Path) -> str:
    """Why the restore is not done yet ("" when it is)."""
    applied = engine.state.applied()
    want = record.get("applied") or {}
    if applied.get("digest") != want.get("digest") or applied.get("outcome") != "committed":
        return (
            f"the applied revision is {applied.get('version')} ({applied.get('digest')}), not "
            f"the restored {want.get('version')} ({want.get('digest')})"
        )
    differing = differences(engine)
    if differing:
        return "the system differs from the restored revision: " + ", ".join(differing[:10])
    if record["mode"] != "full":
        return ""
    for entry in sorted(record.get("staged", {})):
        if not entry.startswith(LEASES + "/"):
            continue
        family = 6 if Path(entry).name.startswith("kea-leases6") else 4
        wanted = {
            lease.address
            for lease in read_leases(family, socket_path=None, lease_file=staged / entry)[1]
        }
        paths = kea_paths(engine.daemons.run_dir(f"kea-dhcp{family}"), family)
        try:
            source, leases = read_leases(family, socket_path=paths.socket, lease_file=paths.leases)
            held = {lease.address for lease in leases}
        except (KeaSocketError, OSError) as exc:
            return f"kea-dhcp{family}: cannot read the leases back: {exc}"
        missing = sorted(wanted - held)
        if missing:
            return (
                f"kea-dhcp{family} ({source}) does not hold {len(missing)} archived lease(s), "
                f"first {missing[0]}"
            )
    return ""


def assert_allocator(engine: Engine) -> None:
    """Tell each running Kea to follow the fence now (the agent asserts it at every start too)."""
    from trueup.subsystems.dhcp.allocator import enforce

    for family in (4, 6):
        run = engine.state.root / "run" / f"kea-dhcp{family}"
        try:
            pid = verified_pid(json.loads(read_file(run / f"kea-dhcp{family}.pid")))
        except (OSError, ValueError):
            continue
        if pid is None:
            continue
        try:
            enforce(kea_paths(run, family), engine.state.root, pid, wait=5.0)
        except (KeaError, OSError):
            continue  # the DHCP subsystem sees the disagreement and asserts it
