"""Fleet plan benchmark: plan and publish 10,000 devices from 5 profiles on the control plane.

The profiles and devices of `scripts.bench_render` (a base for all, one per site,
one per role; labels and 4-7 variables each), stored in a control plane on SQLite
through its own service units (every write audited). Then, timed:

1. **Plan every device** (`Planner.plan`: read the tenant's inputs, vouch for them
   against the audit log, render, compare with the desired revision, diff): wall
   time, µs per device, peak RSS. Baseline in the same run: rendering the same
   devices in process (`Renderer.render`, no database, no diff).
2. **Publish** the plan (one transaction per device: the revision, its
   provenance, its audit entry; the device's inputs first when it had none).
3. **Plan again** with nothing changed (every device rendered, every digest equal).
4. **A proposed one-variable change** (`VariablesChange` on one device): only that
   device is rendered; compared with the full plan.

`python -m scripts.bench plan` (writes docs/benchmarks.md) or
`python -m scripts.bench_plan [--quick]`.
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import time
from pathlib import Path

from scripts.bench_render import devices, profiles
from trueup.model.layering import Renderer
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.fleettypes import VariablesChange

DEVICES = 10_000
QUICK_DEVICES = 2_000


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _seed(plane: ControlPlane, count: int) -> int:
    """A tenant with the profiles, and `count` devices with their labels and variables."""
    tenant_id = plane.create_tenant("bench", "bench")
    for profile in profiles():
        plane.put_profile(tenant_id, profile.name, 0, profile.as_json(), actor="bench")
    for device in devices(count):
        plane.create_device(tenant_id, device.name, "bench", labels=dict(device.labels))
        plane.put_device_variables(
            tenant_id, device.name, 0, variables=dict(device.variables), own=None, actor="bench"
        )
    return tenant_id


def run(quick: bool = False) -> str:
    count = QUICK_DEVICES if quick else DEVICES
    with tempfile.TemporaryDirectory(prefix="trueup-bench-plan-") as tmp:
        database = Database(f"sqlite:///{Path(tmp) / 'server.db'}")
        database.migrate()
        plane = ControlPlane(database, load_or_create_server_key(Path(tmp) / "server.key"))
        start = time.perf_counter()
        tenant_id = _seed(plane, count)
        seed_s = time.perf_counter() - start
        gc.collect()
        rss_before = _rss_mb()

        start = time.perf_counter()
        renderer = Renderer(profiles())
        for device in devices(count):
            renderer.render(device)
        render_s = time.perf_counter() - start

        start = time.perf_counter()
        plan = plane.plan(tenant_id)
        plan_s = time.perf_counter() - start
        rss_peak = _rss_mb()
        assert len(plan.targets) == count and not plan.refused, (len(plan.targets), plan.refused)

        start = time.perf_counter()
        published = plane.publish_plan(tenant_id, plan, actor="bench", comment="bench")
        publish_s = time.perf_counter() - start
        assert len(published.stored) == count and not published.refused

        start = time.perf_counter()
        again = plane.plan(tenant_id)
        again_s = time.perf_counter() - start
        assert again.exit_code == 0 and again.unchanged == count

        one = VariablesChange("edge-00001", {"lan_mtu": 9000})
        one_s = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            proposed = plane.plan(tenant_id, change=one)
            one_s = min(one_s, time.perf_counter() - start)
            assert [t.device for t in proposed.targets] == ["edge-00001"]
    per_device = plan_s / count * 1e6
    return "\n".join(
        [
            "## The fleet plan on the control plane",
            "",
            f"{count:,} devices from 5 profiles (the rendering benchmark's profiles, labels "
            "and variables), stored in a control plane on SQLite through its service (every "
            f"write audited; seeding took {seed_s:.0f} s). *Plan*: read the tenant's inputs, "
            "vouch for them against the audit log, render, compare each with its desired "
            "revision and list the changed paths (here every device: none has a revision "
            "yet). *Baseline*: rendering the same devices in process, no database. *Publish*: "
            "one transaction per device (revision, provenance, audit entry, the device's "
            "inputs). *Plan again*: nothing changed. *One variable*: a proposed change of one "
            "device's variable renders only that device (best of 3).",
            "",
            "| figure | value | baseline | ratio |",
            "|---|---:|---:|---:|",
            f"| plan {count:,} devices, s | {plan_s:.2f} | {render_s:.2f} | "
            f"{plan_s / render_s:.2f} |",
            f"| per device, µs | {per_device:.0f} | {render_s / count * 1e6:.0f} | "
            f"{plan_s / render_s:.2f} |",
            f"| peak RSS, MB (before: {rss_before:.0f}) | {rss_peak:.0f} | — | — |",
            f"| publish {count:,} devices, s | {publish_s:.2f} | — | — |",
            f"| plan again, nothing changed, s | {again_s:.2f} | {plan_s:.2f} | "
            f"{again_s / plan_s:.2f} |",
            f"| proposed one-variable change, s | {one_s:.3f} | {plan_s:.2f} (all) | "
            f"{one_s / plan_s:.3f} |",
            "",
            "Goal: under 10 s and 500 MB for 10,000 devices. Measured by "
            "`.venv/bin/python -m scripts.bench plan`.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_DEVICES} devices")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
