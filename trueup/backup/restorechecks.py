"""What the restore state machine checks: differences, verification, the allocator.

Who calls this: `trueup.backup.restore` — `verify` in `verifying`,
`differences` to decide whether a rolled-back restore is back at its
previous revision, `assert_allocator` right after the fence is held or
lifted. Everything here reads (Kea's leases through `read_leases`: its
socket, else the memfile — never by starting or stopping Kea) except
`assert_allocator`, which tells a running Kea to follow the fence record.
"""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path
from typing import Any

from trueup.backup.format import LEASES
from trueup.reconcile.engine import Engine
from trueup.system.daemon import proc_start_time, verified_pid
from trueup.system.fence import read_fence
from trueup.system.kea import KeaError, kea_paths
from trueup.system.kealeases import KeaSocketError, read_leases
from trueup.system.processes import signal_all, wait_gone
from trueup.system.safefile import read_file

__all__ = ["assert_allocator", "differences", "fence_kea", "verify"]


def differences(engine: Engine) -> list[str]:
    """Paths where the system differs from the applied revision (empty: it matches)."""
    document = engine.applied_document()
    if document is None:
        return []
    errors: dict[str, str] = {}
    with engine.sources() as net:
        found = engine.differences(document, net, errors=errors)
    # Failing before the restored revision and unchanged by it (the reconcile loop heals
    # them): a failing DNS or proxy never holds a restore, or DHCP's fence, hostage.
    for name in engine.state.applied().carried:
        found.pop(name, None)
        errors.pop(name, None)
    out = [f"{name}: {d.path}" for name, diffs in found.items() for d in diffs]
    return out + [f"{name}: {why}" for name, why in errors.items()]


def verify(engine: Engine, record: dict[str, Any], staged: Path) -> str:
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


def _kea_runs(engine: Engine) -> list[tuple[int, Path]]:
    out = []
    for family in (4, 6):
        run = engine.state.root / "run" / f"kea-dhcp{family}"
        if run.is_dir():
            out.append((family, run))
    return out


def _kea_pid(run: Path, family: int) -> int | None:
    try:
        return verified_pid(json.loads(read_file(run / f"kea-dhcp{family}.pid")))
    except (OSError, ValueError):
        return None


def fence_kea(engine: Engine) -> None:
    """Before the fence is recorded as held: every Kea trueup runs drops every packet and is
    told `dhcp-disable`, and the file each starts from carries the fence class (a Kea
    started from it by anyone, the agent down, drops too).

    Raises `KeaError` naming the Kea that did not take the fence: the restore then
    does not record the fence (nor go on) while that Kea may still serve.
    """
    from trueup.subsystems.dhcp.allocator import enforce, fence_config_file

    for family, run in _kea_runs(engine):
        paths = kea_paths(run, family)
        fence_config_file(paths, True)
        pid = _kea_pid(run, family)
        if pid is None:
            continue
        try:
            enforce(paths, engine.state.root, pid, wait=5.0, fenced=True)
        except (KeaError, OSError) as exc:
            if _timed_out(exc) and _ended(pid):
                # A hung Kea (its socket takes the command, nothing answers) could serve
                # again the moment it goes on: ended instead. Its next start is from the
                # file that carries the fence class.
                continue
            raise KeaError(f"kea-dhcp{family} (pid {pid}) did not take the fence: {exc}") from exc


def _timed_out(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError) or "timed out" in str(seen):
            return True
        seen = seen.__cause__
    return False


def _ended(pid: int) -> bool:
    """SIGKILL to `pid` (still the process it was); True once it is gone."""
    begun = proc_start_time(pid)
    if begun is None:
        return True
    members = {pid: begun}
    signal_all(members, signal.SIGKILL)
    return wait_gone(members, 10.0)


def assert_allocator(engine: Engine) -> None:
    """Tell each running Kea to follow the fence now (the agent asserts it at every start too),
    and make the file each Kea starts from follow it."""
    from trueup.subsystems.dhcp.allocator import enforce, fence_config_file

    held = read_fence(engine.state.root, "dhcp") is not None
    for family, run in _kea_runs(engine):
        paths = kea_paths(run, family)
        with contextlib.suppress(OSError):  # the supervisor writes it before Kea's next start
            fence_config_file(paths, held)
        pid = _kea_pid(run, family)
        if pid is None:
            continue
        try:
            enforce(paths, engine.state.root, pid, wait=5.0)
        except (KeaError, OSError):
            continue  # the DHCP subsystem sees the disagreement and asserts it
