"""What the restore state machine checks: differences, verification, the allocator.

Who calls this: `trueup.backup.restore` — `verify` in `verifying`,
`differences` to decide whether a rolled-back restore is back at its
previous revision, `fence_kea` before the fence is recorded and
`assert_allocator` right after it is held or lifted. Everything here reads
(Kea's leases through `read_leases`: its socket, else the memfile — never by
starting or stopping Kea) except those two, which tell every Kea to follow
the fence through the DHCP subsystem's fence hook (`follow_fence`, found
through the registry: the one the CLI uses too).
"""

from __future__ import annotations

from pathlib import Path

from trueup.backup.format import LEASES
from trueup.journal.restore import RestoreRecord
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.subsystems.registry import fence_follower
from trueup.system.kea import kea_paths
from trueup.system.kealeases import KeaSocketError, read_leases

__all__ = ["assert_allocator", "differences", "fence_kea", "verify"]


def differences(engine: Engine) -> list[str]:
    """Paths where the system differs from the applied revision (empty: it matches)."""
    document = engine.applied_document()
    if document is None:
        return []
    errors: dict[str, str] = {}
    with engine.sources() as net:
        found = observing.differences(engine, document, net, errors=errors)
    # Failing before the restored revision and unchanged by it (the reconcile loop heals
    # them): a failing DNS or proxy never holds a restore, or DHCP's fence, hostage.
    for name in engine.state.applied().carried:
        found.pop(name, None)
        errors.pop(name, None)
    out = [f"{name}: {d.path}" for name, diffs in found.items() for d in diffs]
    return out + [f"{name}: {why}" for name, why in errors.items()]


def verify(engine: Engine, record: RestoreRecord, staged: Path) -> str:
    """Why the restore is not done yet ("" when it is)."""
    applied = engine.state.applied()
    want = record.get("applied") or {}
    if applied.digest != want.get("digest") or applied.outcome != "committed":
        return (
            f"the applied revision is {applied.version} ({applied.digest}), not "
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


def fence_kea(engine: Engine) -> None:
    """Before the fence is recorded as held: every Kea trueup runs drops every packet and is
    told `dhcp-disable`, and the file each starts from carries the fence class (a Kea
    started from it by anyone, the agent down, drops too).

    Raises `KeaError` naming the Kea that did not take the fence: the restore then
    does not record the fence (nor go on) while that Kea may still serve. A hung Kea
    (its socket takes the command, nothing answers) could serve again the moment it
    goes on: it is ended instead, and its next start is from the fenced file.
    """
    fence_follower("dhcp").follow_fence(engine.state.root, fenced=True, end_hung=True)


def assert_allocator(engine: Engine) -> None:
    """Tell each running Kea to follow the fence now (the agent asserts it at every start too),
    and make the file each Kea starts from follow it; a Kea that does not answer is left
    to the DHCP subsystem, which sees the disagreement and asserts it."""
    fence_follower("dhcp").follow_fence(engine.state.root)
