"""An upgrade whose release passes `trueup preflight` but whose agent does not come up (no
READY=1): the package's postinst goes back to the previous release and restarts it, and the
configuration fails; a good package installed afterwards replaces it as usual."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from scripts import build_deb
from tests.packaging.debian import CACHE, UNIT, V1, V2, DebianRoot, debian_root, repack, wait_for

pytestmark = [pytest.mark.root, pytest.mark.timeout(1500)]

V4 = "0.1.0+t4"
# Imported by the full agent after the fast path, never by `trueup preflight`.
LATE_MODULE = "trueup/agent/launch"

DOCUMENT = """apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-deb-start}
spec:
  management: {interface: mgmt0, addresses: ["198.51.100.2/24"], gateway: 198.51.100.1}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    out = tmp_path_factory.mktemp("debs")
    debs = {v: build_deb.build(v, out, CACHE) for v in (V1, V2)}
    debs[V4] = repack(debs[V2], V4, LATE_MODULE, out)
    yield from debian_root(debs)


def test_an_agent_that_does_not_come_up_is_replaced_by_the_previous_release(
    root: DebianRoot,
) -> None:
    root.run("ip", "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0p")
    root.run("ip", "link", "set", "mgmt0p", "up")
    root.run("mkdir", "-p", "-m", "0750", "/etc/trueup")
    root.run("sh", "-c", f"cat > /etc/trueup/desired.yaml <<'EOF'\n{DOCUMENT}EOF")
    # With a document in place, the first install checks the release and starts the agent.
    first = root.run("dpkg", "-i", root.deb(V1))
    assert "ready: no blockers" in first.stdout
    started = root.unit()
    assert started["ActiveState"] == "active", started
    wait_for("the document applied", lambda: root.exists("/var/lib/trueup/applied.json"))
    applied = json.loads(root.read("/var/lib/trueup/applied.json"))

    result = root.run("dpkg", "-i", root.deb(V4), check=False)
    assert result.returncode != 0, result.stdout
    assert "ready: no blockers" in result.stdout  # the preflight passed: this is the second net
    assert f"release {V4} did not start; going back to {V1}" in result.stderr
    assert root.current() == f"releases/{V1}"
    assert not root.exists(f"/opt/trueup/releases/{V4}")
    back = root.unit()
    assert back["ActiveState"] == "active" and back["MainPID"] != started["MainPID"]
    assert f"agent {V1} (pid {back['MainPID']}" in root.versions()
    assert json.loads(root.read("/var/lib/trueup/applied.json")) == applied
    status = root.run("dpkg-query", "-W", "-f", "${Status} ${Version}", "trueup-agent").stdout
    assert status == f"install ok half-configured {V4}"

    # A fixed package installed over the half-configured one replaces the agent.
    fixed = root.run("dpkg", "-i", root.deb(V2), check=False)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    now = root.unit()
    assert now["ActiveState"] == "active" and now["MainPID"] != back["MainPID"]
    assert f"agent {V2} (pid {now['MainPID']}" in root.versions()
    assert root.current() == f"releases/{V2}"
    assert json.loads(root.read("/var/lib/trueup/applied.json"))["version"] == applied["version"]
    assert root.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
