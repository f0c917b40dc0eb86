"""The package where systemd does not run (a chroot building an image, a container without an
init): with a document in place, install and upgrade still check the release with `trueup
preflight`, switch /opt/trueup/current and enable the unit for the next boot, and succeed
without starting anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scripts import build_deb
from tests.packaging.debian import CACHE, UNIT, V1, V2, DebianRoot, _root_tarball, podman

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

DOCUMENT = """apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-deb-chroot}
spec:
  management: {interface: mgmt0, addresses: ["198.51.100.2/24"], gateway: 198.51.100.1}
"""


class RootWithoutSystemd(DebianRoot):
    def start(self) -> None:
        podman("import", "--quiet", str(_root_tarball()), self.image)
        deb_dir = next(iter(self.debs.values())).parent
        podman(
            "run", "-d", "--name", self.name, "--network", "none",
            "-v", f"{deb_dir}:/debs:ro", self.image, "sleep", "infinity",
        )  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRoot]:
    out = tmp_path_factory.mktemp("debs")
    root = RootWithoutSystemd({v: build_deb.build(v, out, CACHE) for v in (V1, V2)})
    try:
        root.start()
        yield root
    finally:
        root.close()


def test_install_and_upgrade_without_systemd(root: DebianRoot) -> None:
    assert not root.exists("/run/systemd/system")
    root.run("mkdir", "-p", "-m", "0750", "/etc/trueup")
    root.run("sh", "-c", f"cat > /etc/trueup/desired.yaml <<'EOF'\n{DOCUMENT}EOF")
    for version in (V1, V2):
        result = root.run("dpkg", "-i", root.deb(version), check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ready: no blockers" in result.stdout
        assert root.current() == f"releases/{version}"
        assert root.run("trueup", "--version").stdout.startswith(f"trueup {version}")
    assert root.exists(f"/etc/systemd/system/multi-user.target.wants/{UNIT}")
    assert set(root.run("ls", "/opt/trueup/releases").stdout.split()) == {V1, V2}
    assert root.run("pgrep", "-f", "agent run", check=False).returncode == 1
    removed = root.run("dpkg", "-r", "trueup-agent", check=False)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert not root.exists("/opt/trueup/releases") and root.exists("/etc/trueup/desired.yaml")
