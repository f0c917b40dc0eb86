"""End to end: a rollout whose canary is a real router, gated by its agent's own health.

The control plane runs in the operator namespace (198.51.100.1); edge-01's agent
in the router namespace is managed by it (the confirmation test's set-up). Beside
it, SIMULATED devices report through the control plane's report ingest (the same
writer the report route uses), each taking its desired revision and confirming it.

1. A good change (a firewall) in 3 waves — the real canary, then 50 %, then the
   rest — with a confirmation window: the canary's kernel has the ruleset, its
   agent confirms it by itself, every gate passes, the rollout completes, and the
   audit trail has each step.
2. A bad change (a firewall that drops the management API and the control plane)
   in the canary wave: the canary rolls back by itself within its window, the
   rollout pauses after wave 1 with the canary put back on its previous revision,
   and no device of the later waves receives anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_confirm_rollback_e2e import (
    EVENT_WAIT,
    PORT,
    WINDOW,
    ControlPlane,
    _document,
    _firewall,
)
from tests.routers import Router
from trueup.model.document import document_digest, parse_document
from trueup.server.db import Database
from trueup.server.ingest import PendingReport, ReportIngest
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane as Plane

pytestmark = pytest.mark.root

SIMULATED = 40


def _simulated(device: str, mtu: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"management": {"interface": "mgmt0", "addresses": ["198.51.100.9/24"]}}
    if mtu is not None:
        spec["interfaces"] = [{"name": "lan0", "state": "up", "mtu": mtu}]
    return {"apiVersion": "trueup/v1", "kind": "DeviceState", "metadata": {"device": device},
            "spec": spec}  # fmt: skip


class Simulated:
    """Simulated devices: each applies and confirms whatever its desired revision is."""

    def __init__(self, plane: Plane, database: Database, tenant_id: int) -> None:
        self.plane, self.tenant_id = plane, tenant_id
        self.ingest = ReportIngest(database)
        self.names = [f"sim-{i:03d}" for i in range(SIMULATED)]
        self.received: dict[str, list[int]] = {n: [] for n in self.names}
        for name in self.names:
            plane.create_device(tenant_id, name, "test")
            plane.put_desired(tenant_id, name, 0, _simulated(name, None), author="test")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def tick(self) -> None:
        batch = []
        for name in self.names:
            revision = self.plane.desired(self.tenant_id, name)
            assert revision is not None
            if not self.received[name] or self.received[name][-1] != revision.version:
                self.received[name].append(revision.version)
            batch.append(
                PendingReport(
                    self.plane.device_id(self.tenant_id, name),
                    time.time(),
                    {
                        "applied_version": revision.version,
                        "applied_digest": revision.content_hash,
                        "applied_origin": "control-plane",
                        "management_ready": True,
                        "reason_codes": [],
                        "heartbeat_interval": 30.0,
                        "journal": {"last": {"version": revision.version, "state": "commit"}},
                        "confirmation": {"version": revision.version, "state": "confirmed"},
                    },
                )
            )
        self.ingest.write_isolated(batch)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.tick()


@pytest.fixture
def fleet(router_with_client: Router) -> Iterator[tuple[ControlPlane, Plane, Simulated]]:
    router = router_with_client
    cp = ControlPlane(router, "198.51.100.1")
    assert cp.put(0, _document()) == 1
    router.wait_for(
        lambda: cp.entry().get("applied_version") == 1, what="revision 1", timeout=EVENT_WAIT
    )
    db = Path(router.workdir) / "cp.db"
    database = Database(f"sqlite:///{db}")
    plane = Plane(database, load_or_create_server_key(Path(f"{db}.key"), create=False))
    sims = Simulated(plane, database, plane.tenant_id("acme"))
    sims.thread.start()
    try:
        yield cp, plane, sims
    finally:
        sims.stop.set()
        sims.thread.join(30)
        database.dispose()


def _start(cp: ControlPlane, sims: Simulated, edge: dict[str, Any], mtu: int, **spec: Any) -> int:
    targets = [{"device": "edge-01", "document": edge}] + [
        {"device": n, "document": _simulated(n, mtu)} for n in sims.names
    ]
    status, body = cp.router.from_client(
        f"{cp.url}/api/v1/rollouts",
        cp.token,
        timeout=60,
        method="POST",
        body={
            "targets": targets,
            "waves": [{"devices": ["edge-01"]}, {"percent": 50}, {"percent": 100}],
            "confirm_within": WINDOW,
            "max_unavailable": "50%",
            "gate_timeout": 240,
            **spec,
        },
    )
    assert status == 201, body
    return int(body["id"])


def test_a_real_canary_gates_a_rollout_and_a_bad_change_stops_at_it(
    fleet: tuple[ControlPlane, Plane, Simulated],
) -> None:
    cp, plane, sims = fleet
    router, tenant_id = cp.router, sims.tenant_id

    good = _document(firewall=_firewall(bad=False))
    first = _start(cp, sims, good, 1400, comment="firewall: drop smtp")
    router.wait_for(
        lambda: plane.rollout(tenant_id, first)["state"] != "running",
        what="the good rollout completed",
        timeout=EVENT_WAIT * 2,
    )
    done = plane.rollout(tenant_id, first)
    assert done["state"] == "completed", done
    assert all(m["state"] == "passed" for m in done["members"]), done["members"]
    assert [w["members"] for w in done["waves"]] == [1, SIMULATED // 2, SIMULATED // 2]
    assert "tcp dport 25 drop" in router.run("nft", "list", "table", "inet", "trueup").stdout
    canary = next(m for m in done["members"] if m["device"] == "edge-01")
    assert cp.confirmation()["state"] == "confirmed"
    assert cp.confirmation()["version"] == canary["sent_version"]
    actions = [e["action"] for e in plane.audit_entries(tenant_id, limit=10_000)]
    for action in (
        "rollout.start",
        "rollout.send",
        "rollout.gate",
        "rollout.wave",
        "rollout.complete",
    ):
        assert action in actions, action  # fmt: skip

    received = {n: list(v) for n, v in sims.received.items()}
    bad = _document(firewall=_firewall(bad=True))
    second = _start(cp, sims, bad, 1300, failure_budget=0)
    router.wait_for(
        lambda: plane.rollout(tenant_id, second)["state"] != "running",
        what="the bad rollout paused at its canary",
        timeout=EVENT_WAIT * 2,
    )
    paused = plane.rollout(tenant_id, second)
    assert paused["state"] == "paused", paused
    canary = next(m for m in paused["members"] if m["device"] == "edge-01")
    assert canary["state"] == "reverted", canary
    assert "back by itself" in canary["reason"], canary
    assert all(m["state"] == "pending" for m in paused["members"] if m["wave"] > 0)
    # The canary is put back on the good revision, and no simulated device received a thing.
    history = plane.revisions(tenant_id, "edge-01")
    assert history[-1].version == canary["reverted_version"]
    assert history[-1].content_hash == document_digest(parse_document(good))
    assert sims.received == received
    assert f"dport {PORT} drop" not in router.run("nft", "list", "table", "inet", "trueup").stdout
